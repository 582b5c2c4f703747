"""The collective kernels: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute,
collective-broadcast (and their -start/-done forms), replica-id and partition-id.

Each factory resolves the replica's group, the fingerprint and the reduction once, at bind time;
the kernel then numbers the collective, publishes what it waits for and runs the algorithm from
`algorithms`. An async `-start` performs the whole collective and its `-done` returns the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.collectives import algorithms as alg
from replicas.collectives.exchange import Exchange
from replicas.collectives.fingerprint import Fingerprint, make_fingerprint
from replicas.collectives.groups import GroupPlan, intern, is_spmd, plan_groups, verified_pairs
from replicas.collectives.selector import THRESHOLDS
from replicas.collectives.topology import Topology, topology
from replicas.hlo.ir import Instruction
from replicas.ops.recognize import binary_reducer
from replicas.ops.registry import KernelContext, kernel
from replicas.records import BlockInfo
from replicas.shapes import Shape
from replicas.transport.fabric import Fabric, FabricSlot

_UFUNCS: dict[str, np.ufunc] = {
    "add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}
# XLA's arithmetic on pred: add saturates to or, multiply is and.
_PRED_UFUNCS: dict[str, np.ufunc] = {
    "add": np.logical_or, "multiply": np.logical_and, "maximum": np.logical_or, "minimum": np.logical_and,
    "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
}


def computation_of(ctx: KernelContext, inst: Instruction) -> str:
    """The name of the computation `inst` belongs to (its identity for collective matching)."""
    for comp in ctx.module.computations.values():
        if comp.by_name.get(inst.name) is inst:
            return comp.name
    return "?"


_new = object.__new__


class Collective:
    """One bound collective instruction on one replica: numbering, blocking info, recording.

    Everything a call needs that does not change from call to call is resolved here or at the first
    call of a job (the group's topology under the job's placement), so a call is a handful of
    attribute reads before its algorithm runs (a While loop of a 1 KiB all-reduce at N=256 runs this
    once per replica per iteration)."""

    def __init__(self, inst: Instruction, ctx: KernelContext, group: tuple[int, ...], fingerprint: Fingerprint,
                 index: int | None, operand_shapes: list[Shape] | None = None) -> None:
        self.inst = inst
        self.fabric = ctx.fabric
        # The interpreter's `FabricSlot` forwards every attribute read: a call unwraps it once.
        self._slot = self.fabric if type(self.fabric) is FabricSlot else None
        self.group = group
        self.index = index  # position in `group`; None for collective-permute (point to point)
        self.fingerprint = fingerprint
        self.fingerprint_dict = fingerprint.as_dict()
        self._topology: Topology | None = None
        self._placement: Any = None
        arrays = [leaf for s in operand_shapes or () for leaf in s.leaves() if leaf.is_array]
        self._operand_bytes = sum(leaf.numel * leaf.dtype.itemsize for leaf in arrays)
        self._operand_arrays = len(arrays)
        # Collective-broadcast's leaders' step is messages to the other leaders' mailboxes.
        self._leaders_on_board = inst.opcode != "collective-broadcast"
        # What the call publishes while it waits: a copy of this with its `seq` (a dataclass's
        # keyword __init__ cost more than the rest of a member's call).
        self._block = BlockInfo("collective", inst.name, inst.opcode, needs="group",
                                computation=fingerprint.computation, group=group).__dict__

    def topology(self) -> Topology | None:
        # Placement is known once the job connected its replicas, after binding: computed at first use,
        # again when a pooled interpreter runs in a job of another placement.
        placement = self.fabric.placement
        if self.index is not None and (self._topology is None or placement is not self._placement):
            self._topology = topology(self.group, self.index, placement, self.fabric.nodes)
            self._placement = placement
        return self._topology

    def _job_of(self, fabric: Fabric) -> tuple[Any, Exchange, dict[str, Any] | None]:
        """What a call needs of its job, decided at its first call and kept with the job's fabric (a
        pooled kernel holds nothing of a job): (the placement it was decided for, an `Exchange` over
        the group's topology under it and the meeting (see `_meeting_of`), which each call numbers
        anew, and the recorder's template of its events)."""
        topo = self.topology()
        recorder = fabric.recorder
        template = None
        if recorder is not None:
            # The group is the interned tuple itself: a copy per event would cost O(N) per member.
            template = recorder.collective_template(self.group, self.fingerprint.wire, self.fingerprint_dict,
                                                    self.inst.name, self.inst.opcode)
        ex = Exchange(fabric, -1, self.fingerprint, None, topo, self._meeting_of(fabric, topo))
        job = fabric.kernel_state[self] = (fabric.placement, ex, template)
        return job

    def _meeting_of(self, fabric: Fabric, topo: Topology | None) -> Any:
        """The mailbox this process's members of the group meet on, so that the last to arrive leads
        (collectives/topology.py), or None: the first local member leads. The last may lead when the
        group has more than one member here, the transport gives the first member's mailbox, and the
        leaders' step never needs a fixed leader's mailbox: the group is in this process, or its
        leaders' rounds go through the same-node board and their payloads surely fit a slot (at most
        the local members' operands, plus the fingerprint and a margin per array for the layout)."""
        if topo is None or len(topo.local) < 2:
            return None
        box = fabric.local_mailbox(topo.leader)
        if box is None:
            return None
        leaders = topo.layout.leaders
        if len(leaders) == 1:
            return box
        shared = fabric.shared
        board = shared.board if shared is not None else None
        if (not self._leaders_on_board or board is None or len(leaders) > THRESHOLDS.board_readers
                or not all(r in shared.same_node for r in leaders)):
            return None
        arrays = self._operand_arrays * len(topo.local) * len(topo.group)
        bound = (self._operand_bytes * len(topo.local) + len(board.fingerprint_bytes(self.fingerprint.wire))
                 + (64 << 10) + 512 * arrays)
        return box if bound <= board.smallest else None

    def run(self, algorithm: Callable[..., Any], *args: Any) -> Any:
        """Number the collective, record it and run `algorithm(exchange, *args)`. (`exchange` inlined: a
        While loop of a 1 KiB all-reduce at N=256 runs this once per replica per iteration.)"""
        slot = self._slot
        fabric = self.fabric if slot is None else slot.current
        seq = fabric.next_collective()
        block = _new(BlockInfo)
        block.__dict__ = self._block.copy()
        block.seq = seq
        job = fabric.kernel_state.get(self)
        if job is None or job[0] is not fabric.placement:
            job = self._job_of(fabric)
        # The job's exchange of this call site, for this call (a replica runs one collective at a time).
        ex = job[1]
        ex.seq, ex.block, ex._boxes = seq, block, None
        template = job[2]
        try:
            if template is None:
                return algorithm(ex, *args)
            recorder = fabric.recorder
            event = recorder.begin_collective(template, seq)
            try:
                result = algorithm(ex, *args)
            except BaseException as e:
                recorder.end(event, error=f"{type(e).__name__}: {e}")
                raise
            recorder.ended(event)
            event["algorithm"] = ex.algorithm  # the selector's choice, in the trace
            return result
        finally:
            if ex._reads:
                ex.release()  # board buffers this replica read (normally released with its results)


def _bind(inst: Instruction, ctx: KernelContext, *, pairs: tuple | None = None
          ) -> tuple[GroupPlan | None, Collective]:
    operand_shapes = ctx.operand_shapes(inst)
    plan = None
    if pairs is None:
        plan = plan_groups(inst, ctx.module, ctx.replica_id, ctx.num_replicas)
    fp = make_fingerprint(inst, computation_of(ctx, inst), operand_shapes, ctx.module,
                          groups=plan.groups if plan is not None else (), pairs=pairs or ())
    if plan is not None:
        return plan, Collective(inst, ctx, plan.group, fp, plan.index, operand_shapes)
    return plan, Collective(inst, ctx, intern(tuple(sorted({r for p in pairs or () for r in p}))), fp, None)


def _dimension(inst: Instruction) -> int:
    return int(inst.attrs["dimensions"][0])  # the verifier checked: one dimension, in range


def make_combine(inst: Instruction, ctx: KernelContext, dtypes: list[np.dtype]) -> alg.Combine:
    """`combine(a, b)` over tuples of arrays, one per operand, with the `to_apply` reduction (a
    scalar computation of two parameters, which the verifier checked)."""
    name = inst.attrs["to_apply"]
    comp = ctx.computation_ir(name)
    op = binary_reducer(comp)
    ufuncs = None
    if op is not None:
        ufuncs = [(_PRED_UFUNCS if dt == np.bool_ else _UFUNCS).get(op) for dt in dtypes]
        if any(u is None for u in ufuncs) or (op in ("and", "or", "xor") and any(dt.kind == "f" for dt in dtypes)):
            ufuncs = None
    if ufuncs is not None:
        pairs = list(zip(ufuncs, dtypes))

        def combine_fast(a: alg.Values, b: alg.Values) -> alg.Values:
            return tuple(np.asarray(u(x, y), dtype=dt) for (u, dt), x, y in zip(pairs, a, b))

        def accumulate(acc: alg.Values, b: alg.Values) -> None:
            for (u, _), x, y in zip(pairs, acc, b):
                u(x, y, out=x)

        if len(pairs) == 1:  # one operand (the usual all-reduce): a leader calls this per local member
            u0 = pairs[0][0]

            def accumulate(acc: alg.Values, b: alg.Values) -> None:
                u0(acc[0], b[0], out=acc[0])

            combine_fast.ufunc = u0  # type: ignore[attr-defined]  # reduction.reduce_into's loop

        def into(out: alg.Values, a: alg.Values, b: alg.Values) -> None:
            for (u, _), o, x, y in zip(pairs, out, a, b):
                u(x, y, out=o)

        combine_fast.accumulate = accumulate  # type: ignore[attr-defined]
        combine_fast.into = into  # type: ignore[attr-defined]
        return combine_fast
    fn = ctx.computation(name)

    def combine_each(a: alg.Values, b: alg.Values) -> alg.Values:
        with np.errstate(all="ignore"):
            return tuple(np.asarray(fn(x, y), dtype=dt) for x, y, dt in zip(a, b, dtypes))

    return combine_each


# -- all-reduce ----------------------------------------------------------------------------------------

@kernel("all-reduce", "all-reduce-start")
def make_all_reduce(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    shapes = ctx.operand_shapes(inst)
    plan, coll = _bind(inst, ctx)
    assert plan is not None
    combine = make_combine(inst, ctx, [s.dtype for s in shapes])
    as_tuple = inst.shape.is_tuple

    def all_reduce(*operands: np.ndarray) -> Any:
        out = coll.run(alg.all_reduce, operands, combine)
        return tuple(out) if as_tuple else out[0]

    return all_reduce


@kernel("all-reduce-done")
def make_all_reduce_done(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    return lambda started: started


@kernel("all-gather-done", "collective-permute-done")
def make_second_of_start(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    return lambda started: started[1]


# -- all-gather, reduce-scatter, all-to-all ------------------------------------------------------------

@kernel("all-gather", "all-gather-start")
def make_all_gather(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    shapes = ctx.operand_shapes(inst)
    dim = _dimension(inst)
    plan, coll = _bind(inst, ctx)
    assert plan is not None
    is_start = inst.opcode == "all-gather-start"
    variadic = len(shapes) > 1

    def all_gather(*operands: np.ndarray) -> Any:
        out = coll.run(alg.all_gather, operands, dim)
        result = tuple(out) if variadic else out[0]
        if is_start:
            return (tuple(operands) if variadic else operands[0], result)
        return result

    return all_gather


@kernel("reduce-scatter")
def make_reduce_scatter(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    shapes = ctx.operand_shapes(inst)
    dim = _dimension(inst)
    _, coll = _bind(inst, ctx)  # the verifier checked the dimension divides by the group size
    combine = make_combine(inst, ctx, [s.dtype for s in shapes])
    as_tuple = inst.shape.is_tuple

    def reduce_scatter(*operands: np.ndarray) -> Any:
        out = coll.run(alg.reduce_scatter, operands, dim, combine)
        return tuple(out) if as_tuple else out[0]

    return reduce_scatter


@kernel("all-to-all")
def make_all_to_all(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    # The verifier checked the split dimension divides by the group size (or, without dimensions,
    # one operand per member).
    _, coll = _bind(inst, ctx)
    if inst.attrs.get("dimensions"):
        dim = _dimension(inst)
        as_tuple = inst.shape.is_tuple

        def all_to_all(*operands: np.ndarray) -> Any:
            out = coll.run(alg.all_to_all_split, operands, dim)
            return tuple(out) if as_tuple else out[0]

        return all_to_all

    def all_to_all_tuple(*operands: np.ndarray) -> Any:
        return coll.run(alg.all_to_all_tuple, operands)

    return all_to_all_tuple


# -- collective-permute, collective-broadcast ------------------------------------------------------------

def zeros_of(shape: Shape) -> Any:
    if shape.is_tuple:
        return tuple(zeros_of(s) for s in shape.tuple_shapes)
    if shape.is_token:
        from replicas.shapes import TOKEN

        return TOKEN
    return np.zeros(shape.dimensions, dtype=shape.dtype)


@kernel("collective-permute", "collective-permute-start")
def make_collective_permute(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    shapes = ctx.operand_shapes(inst)
    pairs = verified_pairs(inst)
    _, coll = _bind(inst, ctx, pairs=pairs)
    me = ctx.replica_id
    targets = [t for s, t in pairs if s == me]
    sources = [s for s, t in pairs if t == me]
    source = sources[0] if sources else None
    data_shape = shapes[0]
    is_start = inst.opcode == "collective-permute-start"
    extras: tuple = ()
    if is_start:
        extras = tuple(zeros_of(s) for s in inst.shape.tuple_shapes[2:])

    def zeros() -> Any:
        return zeros_of(data_shape)

    def collective_permute(operand: Any) -> Any:
        result = coll.run(alg.collective_permute, targets, source, operand, zeros)
        return (operand, result, *extras) if is_start else result

    return collective_permute


@kernel("collective-broadcast")
def make_collective_broadcast(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    shapes = ctx.operand_shapes(inst)
    plan, coll = _bind(inst, ctx)
    assert plan is not None
    as_tuple = inst.shape.is_tuple and len(shapes) > 1

    def collective_broadcast(*operands: Any) -> Any:
        value = operands if as_tuple else operands[0]
        return coll.run(alg.collective_broadcast, value)

    return collective_broadcast


# -- ids ---------------------------------------------------------------------------------------------

def _constant(value: int, dtype: np.dtype) -> Callable[[], np.ndarray]:
    arr = np.asarray(value, dtype=dtype)
    arr.setflags(write=False)
    return lambda: arr


@kernel("replica-id")
def make_replica_id(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    # An SPMD program runs its partitions as our replicas; XLA's replica id is then 0 everywhere.
    return _constant(0 if is_spmd(ctx.module) else ctx.replica_id, inst.shape.dtype)


@kernel("partition-id")
def make_partition_id(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    return _constant(ctx.replica_id if is_spmd(ctx.module) else 0, inst.shape.dtype)
