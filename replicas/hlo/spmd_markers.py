"""JAX's lowered (not yet partitioned) modules: their SPMD markers, partitioned for shard_map bodies.

`jax.jit(f).lower(*args).as_text(dialect="hlo")` is the *global* program, before XLA's SPMD
partitioner runs. The partitioner's markers in it:

- `Sharding` custom calls, `sharding=` attributes and other `xla.sdy.*` annotations: the value is
  unchanged (they only steer the partitioner);
- `SPMDFullToShardShape` / `xla.sdy.GlobalToLocalShape`: enter a `shard_map` body: each partition
  takes its shard of the global value (`sharding=` of the operand's `Sharding` call, or
  `xla.sdy.in_shardings` over the module's `xla.sdy.meshes`);
- `SPMDShardToFullShape` / `xla.sdy.LocalToGlobalShape`: leave it: the shards join into the global value.

`partition_spmd_markers` rewrites these into plain HLO: `partition-id` and `dynamic-slice` to
enter, one `all-gather` per sharded dimension to leave. The manual bodies already hold their own
collectives, so the result runs on one replica per partition with the *global* arguments on every
replica, and gives the global results; what lies outside the bodies runs unpartitioned (each
replica computes it whole: the same values, without the partitioner's savings).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation, Instruction, Module
from replicas.shapes import PrimitiveType, Shape

TO_LOCAL = frozenset({"SPMDFullToShardShape", "xla.sdy.GlobalToLocalShape"})
TO_GLOBAL = frozenset({"SPMDShardToFullShape", "xla.sdy.LocalToGlobalShape"})
SDY_PREFIX = "xla.sdy."
_MARKERS = TO_LOCAL | TO_GLOBAL


def has_spmd_markers(module: Module) -> bool:
    """Whether `module` is a lowered SPMD program (it enters or leaves a manual shard_map body)."""
    return any(inst.opcode == "custom-call" and _is_marker(_target(inst)) for _, inst in module.instructions())


def _is_marker(target: str) -> bool:
    return target in _MARKERS or target.startswith(SDY_PREFIX)


def _target(inst: Instruction) -> str:
    return inst.attrs.get("custom_call_target", "") if inst.opcode == "custom-call" else ""


@dataclass(frozen=True)
class Tiling:
    """How a value splits over `num_partitions` partitions: `tiles[d]` shards along dimension d, and
    `index[p, d]` is the shard partition p holds along d (partitions with equal rows hold copies)."""

    tiles: tuple[int, ...]
    index: np.ndarray  # (num_partitions, rank) int

    def replicated_along(self, dim: int) -> Tiling:
        tiles = list(self.tiles)
        tiles[dim] = 1
        index = self.index.copy()
        index[:, dim] = 0
        return Tiling(tuple(tiles), index)


def gspmd_tiling(text: str, rank: int, num_partitions: int | None) -> Tiling:
    """`{devices=[2,1,2]<=[4] last_tile_dim_replicate}`, `{devices=[2,2]0,2,1,3}`, `{replicated}`, ..."""
    body = text.strip().strip("{}").strip()
    m = re.match(r"devices=\[([\d,]+)\](.*)$", body)
    if m is None:
        if body.split(" ")[0] in ("replicated", "manual", "maximal"):
            n = num_partitions or 1
            return Tiling((1,) * rank, np.zeros((n, rank), np.int64))
        raise ProgramError(f"unsupported sharding {text}")
    dims = [int(x) for x in m.group(1).split(",")]
    rest = m.group(2).strip()
    iota = re.match(r"<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest)
    if iota is not None:
        reshape = [int(x) for x in iota.group(1).split(",")]
        devices = np.arange(math.prod(reshape)).reshape(reshape)
        if iota.group(2):
            devices = devices.transpose([int(x) for x in iota.group(2).split(",")])
        devices = devices.reshape(dims)
    else:
        listed = re.match(r"([\d,]+)", rest)
        if listed is None:
            raise ProgramError(f"unsupported sharding {text}")
        devices = np.array([int(x) for x in listed.group(1).split(",")]).reshape(dims)
    index = np.zeros((devices.size, rank), np.int64)
    for coords in np.ndindex(*devices.shape):
        index[devices[coords], :] = coords[:rank]
    return Tiling(tuple(dims[:rank]), index)


def _meshes(module: Module) -> dict[str, tuple[list[tuple[str, int]], list[int]]]:
    """The module's `xla.sdy.meshes`: name -> ([(axis, size)], device ids in mesh order)."""
    text = str(module.attrs.get("frontend_attributes", ""))
    out = {}
    for m in re.finditer(r"([\w.]+) = #sdy\.mesh<\[([^\]]*)\](?:, device_ids=\[([\d, ]*)\])?>", text):
        axes = [(a, int(n)) for a, n in re.findall(r'"([^"]+)"=(\d+)', m.group(2))]
        size = math.prod(n for _, n in axes)
        ids = [int(x) for x in m.group(3).split(",")] if m.group(3) else list(range(size))
        out[m.group(1)] = (axes, ids)
    return out


def sdy_tilings(text: str, ranks: list[int], meshes: dict[str, Any]) -> list[Tiling]:
    """`#sdy.sharding_per_value<[<@mesh, [{"x"}, {}]>, ...]>`: one Tiling per value."""
    values = re.findall(r"<@([\w.]+), \[([^\]]*)\]", text)
    if len(values) != len(ranks):
        raise ProgramError(f"expected {len(ranks)} shardings, got {text}")
    tilings = []
    for (mesh_name, dims_text), rank in zip(values, ranks):
        if mesh_name not in meshes:
            raise ProgramError(f"sharding {text} names mesh @{mesh_name}, which the module does not declare")
        axes, ids = meshes[mesh_name]
        sizes = dict(axes)
        coords = {p: dict(zip(sizes, np.unravel_index(pos, [n for _, n in axes]))) for pos, p in enumerate(ids)}
        dims = re.findall(r"\{([^}]*)\}", dims_text)
        if len(dims) != rank:
            raise ProgramError(f"sharding {text} has {len(dims)} dimensions for a rank-{rank} value")
        tiles, index = [], np.zeros((len(ids), rank), np.int64)
        for d, dim in enumerate(dims):
            if ":(" in dim:
                raise ProgramError(f"sub-axis shardings are not supported: {text}")
            names = re.findall(r'"([^"]+)"', dim)
            tiles.append(math.prod(sizes[a] for a in names))
            for p, c in coords.items():
                shard = 0
                for a in names:
                    shard = shard * sizes[a] + int(c[a])
                index[p, d] = shard
        tilings.append(Tiling(tuple(tiles), index))
    return tilings


def partition_spmd_markers(module: Module) -> Module:
    """A copy of the lowered `module` in which every partition enters and leaves its manual bodies
    itself (see the module docstring); `num_partitions` is the mesh's size."""
    module = copy.deepcopy(module)
    meshes = _meshes(module)
    num_partitions = max([len(ids) for _, ids in meshes.values()] + [1])
    for _, inst in module.instructions():
        if "sharding" in inst.attrs and _target(inst) in ("Sharding", *TO_GLOBAL):
            found = gspmd_tiling(inst.attrs["sharding"], inst.shape.rank if not inst.shape.is_tuple else 0, None)
            num_partitions = max(num_partitions, len(found.index))
    rewriter = _Rewriter(module, meshes, num_partitions)
    for comp in module.computations.values():
        rewriter.rewrite(comp)
    module.attrs["num_partitions"] = num_partitions
    module.attrs.pop("replica_count", None)
    return module


def take_global(module: Module, inputs: list[Tiling], outputs: list[Tiling]) -> None:
    """Change `module`, a per-device SPMD program, in place so that its entry takes the global value of
    every parameter (split as `inputs` say) and returns the global value of every result (`outputs`):
    each parameter becomes the global one cut to the partition's shard, each result is all-gathered."""
    entry = module.entry_computation
    root = entry.root_instruction
    results = _shapes(root.shape, 1)
    rewriter = _Rewriter(module, {}, module.num_partitions)
    for inst in entry.instructions:
        if inst.opcode != "parameter":
            rewriter.out.append(inst)
            continue
        tiling = inputs[inst.attrs["parameter_number"]]
        whole = rewriter._emit(inst.name, "parameter", _tiled(inst.shape, tiling), [],
                               parameter_number=inst.attrs["parameter_number"])
        rewriter._finish(inst, [rewriter._slice_shard(inst, whole, inst.shape, tiling)])
    if root.shape.is_tuple:
        leaves = [rewriter._emit(root.name, "get-tuple-element", r, [root.name], index=i)
                  for i, r in enumerate(results)]
        shape = Shape.tuple([_tiled(r, t) for r, t in zip(results, outputs)])
    else:
        leaves, shape = [root.name], _tiled(results[0], outputs[0])
    out = Instruction(rewriter._name(root.name), root.opcode if root.shape.is_tuple else "copy", shape, leaves)
    rewriter._to_global(out, outputs)
    entry.instructions = rewriter.out
    entry._by_name = None  # noqa: SLF001 - the list was replaced
    entry.root = out.name
    for key in ("entry_computation_layout", "input_output_alias"):  # they describe the shards
        module.attrs.pop(key, None)


def _tiled(local: Shape, tiling: Tiling) -> Shape:
    """The global shape of which `local` is one shard."""
    if not local.is_array or all(t == 1 for t in tiling.tiles):
        return local
    return Shape.array(local.element_type, tuple(n * t for n, t in zip(local.dimensions, tiling.tiles)))


class _Rewriter:
    def __init__(self, module: Module, meshes: dict[str, Any], num_partitions: int) -> None:
        self.module = module
        self.meshes = meshes
        self.num_partitions = num_partitions
        self.names = {inst.name for _, inst in module.instructions()}
        channels = [inst.attrs.get("channel_id") or 0 for _, inst in module.instructions()]
        self.next_channel = max(channels + [0]) + 1
        self.out: list[Instruction] = []
        self.partition: str | None = None

    def rewrite(self, comp: Computation) -> None:
        self.out, self.partition = [], None
        by_name = comp.by_name
        for inst in comp.instructions:
            target = _target(inst)
            if target in TO_LOCAL:
                self._to_local(inst, self._tilings(inst, target, by_name, inst.operands))
            elif target in TO_GLOBAL:
                self._to_global(inst, self._tilings(inst, target, by_name, inst.operands))
            elif target.startswith(SDY_PREFIX) or target == "Sharding":
                if len(inst.operands) != 1 or not by_name[inst.operands[0]].shape.compatible(inst.shape):
                    raise inst.error(f"unsupported JAX marker {target!r}")
                self.out.append(Instruction(inst.name, "copy", inst.shape, list(inst.operands), line=inst.line))
            else:
                self.out.append(inst)
        comp.instructions = self.out
        comp._by_name = None  # noqa: SLF001 - the list was replaced

    def _tilings(self, inst: Instruction, target: str, by_name: dict[str, Instruction],
                 operands: list[str]) -> list[Tiling]:
        ranks = [by_name[o].shape.rank for o in operands] if target in TO_LOCAL else \
            [s.rank for s in _shapes(inst.shape, len(operands))]
        if target.startswith(SDY_PREFIX):
            attrs = inst.attrs.get("frontend_attributes") or {}
            key = "xla.sdy.in_shardings" if target in TO_LOCAL else "xla.sdy.out_shardings"
            if key not in attrs:
                raise inst.error(f"{target} without {key}")
            return sdy_tilings(attrs[key], ranks, self.meshes)
        if target in TO_LOCAL:  # the operand is a `Sharding` call whose attribute tells the split
            source = by_name[operands[0]]
            text = source.attrs.get("sharding") if _target(source) == "Sharding" else None
        else:
            text = inst.attrs.get("sharding")
        if text is None:
            raise inst.error(f"{target} without the sharding it needs")
        return [gspmd_tiling(text, ranks[0], self.num_partitions)]

    def _name(self, base: str) -> str:
        k = 0
        while f"{base}.spmd{k}" in self.names:
            k += 1
        name = f"{base}.spmd{k}"
        self.names.add(name)
        return name

    def _emit(self, base: str, opcode: str, shape: Shape, operands: list[str], **attrs: Any) -> str:
        name = self._name(base)
        self.out.append(Instruction(name, opcode, shape, operands, attrs))
        return name

    def _finish(self, inst: Instruction, parts: list[str]) -> None:
        if inst.shape.is_tuple:
            self.out.append(Instruction(inst.name, "tuple", inst.shape, parts, line=inst.line))
        else:
            self.out.append(Instruction(inst.name, "copy", inst.shape, parts, line=inst.line))

    def _to_local(self, inst: Instruction, tilings: list[Tiling]) -> None:
        parts = []
        for operand, local, tiling in zip(inst.operands, _shapes(inst.shape, len(inst.operands)), tilings):
            parts.append(self._slice_shard(inst, operand, local, tiling))
        self._finish(inst, parts)

    def _slice_shard(self, inst: Instruction, operand: str, local: Shape, tiling: Tiling) -> str:
        if all(t == 1 for t in tiling.tiles) or local.rank == 0:
            return operand
        s32 = Shape.array(PrimitiveType.S32, ())
        rank = local.rank
        offsets = (_rows(tiling, self.num_partitions) * np.array(local.dimensions)).astype(np.int32)
        table = self._emit(inst.name, "constant", Shape.array(PrimitiveType.S32, offsets.shape), [],
                           literal=offsets)
        if self.partition is None:
            pid = self._emit(inst.name, "partition-id", Shape.array(PrimitiveType.U32, ()), [])
            self.partition = self._emit(inst.name, "convert", s32, [pid])
        zero = self._emit(inst.name, "constant", s32, [], literal=np.zeros((), np.int32))
        row = self._emit(inst.name, "dynamic-slice", Shape.array(PrimitiveType.S32, (1, rank)),
                         [table, self.partition, zero], dynamic_slice_sizes=[1, rank])
        starts = []
        for d in range(rank):
            one = self._emit(inst.name, "slice", Shape.array(PrimitiveType.S32, (1, 1)), [row],
                             slice=[(0, 1, 1), (d, d + 1, 1)])
            starts.append(self._emit(inst.name, "reshape", s32, [one]))
        return self._emit(inst.name, "dynamic-slice", local, [operand, *starts],
                          dynamic_slice_sizes=list(local.dimensions))

    def _to_global(self, inst: Instruction, tilings: list[Tiling]) -> None:
        parts = []
        for operand, full, tiling in zip(inst.operands, _shapes(inst.shape, len(inst.operands)), tilings):
            value = operand
            dims = list(full.dimensions)
            local = [n // t for n, t in zip(dims, tiling.tiles)]
            for d, tiles in enumerate(tiling.tiles):
                if tiles == 1:
                    continue
                local[d] = dims[d]
                value = self._emit(inst.name, "all-gather", Shape.array(full.element_type, tuple(local)), [value],
                                   replica_groups=_gather_groups(tiling, d, self.num_partitions),
                                   channel_id=self._channel(), use_global_device_ids=True, dimensions=[d])
                tiling = tiling.replicated_along(d)
            parts.append(value)
        self._finish(inst, parts)

    def _channel(self) -> int:
        self.next_channel += 1
        return self.next_channel - 1


def _shapes(shape: Shape, count: int) -> list[Shape]:
    return list(shape.tuple_shapes) if shape.is_tuple else [shape] * count


def _rows(tiling: Tiling, num_partitions: int) -> np.ndarray:
    if len(tiling.index) != num_partitions:
        raise ProgramError(f"a sharding over {len(tiling.index)} devices in a program over {num_partitions}")
    return tiling.index


def _gather_groups(tiling: Tiling, dim: int, num_partitions: int) -> list[list[int]]:
    """Partitions that hold the same shard on every other dimension, ordered along `dim`."""
    index = _rows(tiling, num_partitions)
    copies: dict[tuple, int] = {}
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for p in range(num_partitions):
        row = tuple(int(x) for x in index[p])
        copy_number = copies.get(row, 0)
        copies[row] = copy_number + 1
        key = (row[:dim] + row[dim + 1:], copy_number)
        groups.setdefault(key, []).append((row[dim], p))
    out = [[p for _, p in sorted(members)] for members in groups.values()]
    if any(len(g) != tiling.tiles[dim] for g in out):
        raise ProgramError(f"sharding along dimension {dim} does not split into groups of {tiling.tiles[dim]}")
    return out
