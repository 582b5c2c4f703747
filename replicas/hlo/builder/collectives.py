"""XlaBuilder collectives: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute,
collective-broadcast, replica-id, partition-id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, XlaOp
from replicas.shapes import Shape

SEND_RECV_PAIRS_ATTR = "_xla_send_recv_source_target_pairs"


def format_source_target_pairs(pairs: Sequence[Sequence[int]]) -> str:
    """[(0, 1), (1, 2)] -> "{{0,1},{1,2}}" (the frontend attribute's spelling)."""
    return "{" + ",".join(f"{{{int(s)},{int(t)}}}" for s, t in pairs) + "}"


class CollectiveOps(BuilderCore):
    def replica_id(self) -> XlaOp:
        return self._emit("replica-id", [])

    def partition_id(self) -> XlaOp:
        return self._emit("partition-id", [])

    # -- collectives -----------------------------------------------------------------------------------
    def _groups(self, replica_groups: Sequence[Sequence[int]] | None) -> list[list[int]]:
        return [[int(r) for r in g] for g in (replica_groups or [])]

    def _collective_attrs(self, replica_groups: Sequence[Sequence[int]] | None, channel_id: int | None,
                          use_global_device_ids: bool | None) -> dict[str, Any]:
        attrs: dict[str, Any] = {"replica_groups": self._groups(replica_groups)}
        if channel_id is not None:
            attrs["channel_id"] = self._channel_id(channel_id)
        if use_global_device_ids:
            attrs["use_global_device_ids"] = True
        return attrs

    def _group_size(self, what: str, groups: list[list[int]], count: int | None) -> int | None:
        """The participants count to infer with: the replica count, else the given shard count."""
        if count is not None:
            if groups and len(groups[0]) != count:
                raise ProgramError(f"{what}: shard count {count} differs from the replica group size "
                                   f"{len(groups[0])}")
            if not groups and self.replica_count is not None and self.replica_count != count:
                raise ProgramError(f"{what}: shard count {count} differs from the replica count "
                                   f"{self.replica_count} (replica_groups is empty: one group of all replicas)")
        if self.replica_count is not None:
            return self.replica_count
        if not groups:
            if count is None:
                raise ProgramError(f"{what}: the group size is unknown; give replica_groups, a shard count, or "
                                   "XlaBuilder(replica_count=...)")
            return count
        return None

    def all_reduce(self, operand: XlaOp | Sequence[XlaOp], computation: Any,
                   replica_groups: Sequence[Sequence[int]] | None = None, channel_id: int | None = None,
                   shape_with_layout: Shape | None = None, use_global_device_ids: bool | None = None) -> XlaOp:
        ops = [self._op(o) for o in (operand if isinstance(operand, (list, tuple)) else [operand])]
        attrs = self._collective_attrs(replica_groups, channel_id, use_global_device_ids)
        attrs["to_apply"] = self._import(computation)
        return self._emit("all-reduce", ops, attrs, num_replicas=self.replica_count)

    def cross_replica_sum(self, operand: XlaOp, replica_groups: Sequence[Sequence[int]] | None = None) -> XlaOp:
        operand = self._op(operand)
        attrs = self._collective_attrs(replica_groups, None, None)
        attrs["to_apply"] = self._scalar_computation("add", operand.shape.element_type)
        return self._emit("all-reduce", [operand], attrs, num_replicas=self.replica_count)

    def all_gather(self, operand: XlaOp, all_gather_dimension: int, shard_count: int | None = None,
                   replica_groups: Sequence[Sequence[int]] | None = None, channel_id: int | None = None,
                   shape_with_layout: Shape | None = None, use_global_device_ids: bool | None = None) -> XlaOp:
        attrs = self._collective_attrs(replica_groups, channel_id, use_global_device_ids)
        attrs["dimensions"] = [int(all_gather_dimension)]
        n = self._group_size("all_gather", attrs["replica_groups"], shard_count)
        return self._emit("all-gather", [self._op(operand)], attrs, num_replicas=n)

    def reduce_scatter(self, operand: XlaOp, computation: Any, scatter_dimension: int,
                       shard_count: int | None = None, replica_groups: Sequence[Sequence[int]] | None = None,
                       channel_id: int | None = None, layout: Any = None,
                       use_global_device_ids: bool | None = None) -> XlaOp:
        attrs = self._collective_attrs(replica_groups, channel_id, use_global_device_ids)
        attrs["dimensions"] = [int(scatter_dimension)]
        attrs["to_apply"] = self._import(computation)
        n = self._group_size("reduce_scatter", attrs["replica_groups"], shard_count)
        return self._emit("reduce-scatter", [self._op(operand)], attrs, num_replicas=n)

    def all_to_all(self, operand: XlaOp, split_dimension: int, concat_dimension: int, split_count: int,
                   replica_groups: Sequence[Sequence[int]] | None = None, channel_id: int | None = None) -> XlaOp:
        """XlaBuilder::AllToAll: an all-to-all along `split_dimension`, then (when the concat dimension
        differs) a reshape/transpose/reshape that moves the received chunks to `concat_dimension`."""
        operand = self._op(operand)
        s = operand.shape
        rank = s.rank
        split, concat, count = int(split_dimension), int(concat_dimension), int(split_count)
        if not (0 <= split < rank and 0 <= concat < rank):
            raise ProgramError(f"all_to_all: split_dimension {split} and concat_dimension {concat} must be "
                               f"dimensions of {s}")
        if count < 1:
            raise ProgramError(f"all_to_all: split_count must be positive, got {count}")
        attrs = self._collective_attrs(replica_groups, channel_id, None)
        attrs["dimensions"] = [split]
        n = self._group_size("all_to_all", attrs["replica_groups"], count)
        if s.dimensions[split] % count:
            raise ProgramError(f"all_to_all: split dimension {split} of {s} (size {s.dimensions[split]}) is not "
                               f"divisible by split_count {count}")
        result = self._emit("all-to-all", [operand], attrs, num_replicas=n)
        if split == concat:
            return result
        dims = list(s.dimensions)
        chunk = dims[split] // count
        expanded = dims[:split] + [count, chunk] + dims[split + 1:]
        x = self.reshape(result, expanded)

        def position(i: int) -> int:  # original dimension i in the expanded array
            return i if i < split else i + 1

        perm = []
        for i in range(rank):
            if i == concat:
                perm.append(split)  # the chunk-source axis goes just before the concat dimension
            perm.append(position(i))
        x = self.transpose(x, perm)
        final = list(dims)
        final[split] = chunk
        final[concat] *= count
        return self.reshape(x, final)

    def all_to_all_tuple(self, operands: Sequence[XlaOp], replica_groups: Sequence[Sequence[int]] | None = None,
                         channel_id: int | None = None) -> XlaOp:
        attrs = self._collective_attrs(replica_groups, channel_id, None)
        return self._emit("all-to-all", [self._op(o) for o in operands], attrs, num_replicas=self.replica_count)

    def collective_permute(self, operand: XlaOp, source_target_pairs: Sequence[Sequence[int]],
                           channel_id: int | None = None) -> XlaOp:
        attrs: dict[str, Any] = {"source_target_pairs": [(int(a), int(b)) for a, b in source_target_pairs]}
        if channel_id is not None:
            attrs["channel_id"] = self._channel_id(channel_id)
        return self._emit("collective-permute", [self._op(operand)], attrs, num_replicas=self.replica_count)

    def collective_broadcast(self, operand: XlaOp, replica_groups: Sequence[Sequence[int]] | None = None,
                             channel_id: int | None = None) -> XlaOp:
        """Every member of a group receives the value of the group's first member."""
        attrs = self._collective_attrs(replica_groups, channel_id, None)
        return self._emit("collective-broadcast", [self._op(operand)], attrs, num_replicas=self.replica_count)
