"""The kernels of a batched program (`runtime/batched.py`): each instruction's kernel for the stacks
of its operands (a stacked value has a leading axis of one row per member).

- Nothing stacked: the op's own kernel (computed once for every member).
- Element-wise ops, broadcast, reshape, transpose, reverse, slice, pad, concatenate, dot, reduce,
  reduce-window, dynamic-slice and dynamic-update-slice: the op's own kernel bound for the stacked
  shapes, with the replica axis as a leading batch dimension (`_shifted`): one numpy call does what
  each member's call did, on the same rows in the same order.
- Control flow: fusions and calls run their callee batched; While and conditional run batched while
  the members agree on the condition or branch, else raise `Divergent`.
- Collectives among the members: their rows reduced, gathered or moved in group order, exactly as
  the in-process unit orders them (`collectives/reduction.py`).
- Anything else: the op's own kernel once per member on its rows, the results stacked.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

import numpy as np

from replicas.collectives.groups import verified_pairs
from replicas.collectives.kernels import make_combine
from replicas.collectives.reduction import reduce_into
from replicas.hlo.ir import Instruction
from replicas.hlo.opcodes import OPCODES
from replicas.ops.elementwise_util import WithOperandShapes
from replicas.ops.registry import lookup
from replicas.runtime import batched_channels, batched_spanning
from replicas.runtime.stacks import (
    CHANNEL_OPS,
    COLLECTIVES,
    Divergent,
    Stack,
    any_stacked,
    conditional_branches,
    full,
    promoter,
)
from replicas.shapes import Shape

if TYPE_CHECKING:
    from replicas.runtime.batched import BatchedContext

Kernel = Callable[..., Any]
_ELEMENTWISE = frozenset({"elementwise_unary", "elementwise_binary", "compare", "select", "convert"})
_ZERO = np.zeros((), np.int32)
_ZERO.flags.writeable = False


def kernel_for(inst: Instruction, ctx: BatchedContext, stacks: list[Stack], out: Stack) -> Kernel:
    op = inst.opcode
    if op in ("fusion", "call"):
        return ctx.batched(inst.attrs["calls" if op == "fusion" else "to_apply"], tuple(stacks))
    if op == "while":
        return _while(inst, ctx, stacks[0], out)
    if op == "conditional":
        return _conditional(inst, ctx, stacks, out)
    if op in COLLECTIVES:
        return _collective(inst, ctx, stacks, out)
    if op in ("replica-id", "partition-id"):
        return _per_member_constant(inst, ctx)
    if op in CHANNEL_OPS:
        return batched_channels.kernel(inst, ctx, stacks)
    if not any(any_stacked(s) for s in stacks) or op in ("tuple", "get-tuple-element"):
        return lookup(inst)(inst, ctx)
    shifted = _shifted(inst, ctx, stacks)
    if shifted is not None:
        return shifted
    return _per_member(inst, ctx, stacks, out)


# -- the op's own kernel on stacked shapes ---------------------------------------------------------------

def _stacked_shape(shape: Shape, size: int) -> Shape:
    return Shape.array(shape.element_type, (size, *shape.dimensions))


def _default_layout(shape: Shape) -> bool:
    return shape.layout is None or shape.layout.minor_to_major == tuple(range(shape.rank - 1, -1, -1))


def _shifted(inst: Instruction, ctx: BatchedContext, stacks: list[Stack]) -> Kernel | None:
    """The op's own kernel for the stacked shapes (the replica axis first), or None."""
    op = inst.opcode
    family = OPCODES[op].family
    size = ctx.size
    shapes = ctx.operand_shapes(inst)
    if not inst.shape.is_array or not all(s.is_array for s in shapes):
        return None
    attrs = dict(inst.attrs)
    widen = [False] * len(shapes)  # operands to repeat for every member (the kernel wants them all stacked)
    lift = [False] * len(shapes)  # stacked operands of lower rank than the result: give them unit dimensions
    extra_index = False
    rank = inst.shape.rank

    def shift(name: str) -> None:
        attrs[name] = [0] + [int(d) + 1 for d in inst.attrs.get(name) or []]

    if family in _ELEMENTWISE:
        lift = [bool(s) and shape.rank < rank for s, shape in zip(stacks, shapes)]
    elif op == "broadcast":
        shift("dimensions")
    elif op in ("reshape", "copy"):
        pass
    elif op == "bitcast":
        if not (_default_layout(shapes[0]) and _default_layout(inst.shape)
                and shapes[0].element_type is inst.shape.element_type):
            return None
    elif op == "transpose":
        shift("dimensions")
    elif op == "reverse":
        attrs["dimensions"] = [int(d) + 1 for d in inst.attrs.get("dimensions") or []]
    elif op == "slice":
        attrs["slice"] = [[0, size, 1], *inst.attrs["slice"]]
    elif op == "pad":
        if stacks[1]:
            return None
        attrs["padding"] = [[0, 0, 0], *inst.attrs["padding"]]
    elif op == "concatenate":
        attrs["dimensions"] = [int(inst.attrs["dimensions"][0]) + 1]
        widen = [not s for s in stacks]
    elif op == "dot":
        for side in ("lhs", "rhs"):
            shift(f"{side}_batch_dims")
            attrs[f"{side}_contracting_dims"] = [int(d) + 1 for d in inst.attrs.get(f"{side}_contracting_dims") or []]
        widen = [not s for s in stacks]
    elif op == "reduce":
        n = len(shapes) // 2
        if any(stacks[n:]):
            return None
        attrs["dimensions"] = [int(d) + 1 for d in inst.attrs.get("dimensions") or []]
        widen = [not s and k < n for k, s in enumerate(stacks)]
    elif op == "reduce-window":
        n = len(shapes) // 2
        if any(stacks[n:]):
            return None
        window = inst.attrs["window"]
        r = shapes[0].rank
        defaults = {"size": 1, "stride": 1, "pad": (0, 0), "lhs_dilate": 1, "rhs_dilate": 1}
        attrs["window"] = {k: [d, *window.get(k, [d] * r)] for k, d in defaults.items()}
        widen = [not s and k < n for k, s in enumerate(stacks)]
    elif op in ("dynamic-slice", "dynamic-update-slice"):
        first = 1 if op == "dynamic-slice" else 2
        if any(stacks[first:]) or not all(s.rank == 0 for s in shapes[first:]) or len(shapes) - first != shapes[0].rank:
            return None
        widen = [not s and k < first for k, s in enumerate(stacks)]
        extra_index = True
    else:
        return None
    out_shape = _stacked_shape(inst.shape, size)
    if inst.shape.rank == 0 and family in _ELEMENTWISE:
        out_shape = Shape.array(inst.shape.element_type, (size,))
    stacked_shapes = [_stacked_shape(s, size) if (st or w) and not lf else
                      (Shape.array(s.element_type, (size,) + (1,) * (rank - s.rank) + s.dimensions) if lf else s)
                      for s, st, w, lf in zip(shapes, stacks, widen, lift)]
    if extra_index:
        first = 1 if op == "dynamic-slice" else 2
        stacked_shapes = [*stacked_shapes[:first], Shape.scalar("s32"), *stacked_shapes[first:]]
    shifted = Instruction(inst.name, op, out_shape, list(inst.operands), attrs, line=inst.line)
    fn = lookup(inst)(shifted, WithOperandShapes(ctx, stacked_shapes))
    if not any(widen) and not any(lift) and not extra_index:
        return fn
    lifted = {k: (size,) + (1,) * (rank - shapes[k].rank) + shapes[k].dimensions for k, lf in enumerate(lift) if lf}
    wide = {k: (size, *shapes[k].dimensions) for k, w in enumerate(widen) if w}
    first = (1 if op == "dynamic-slice" else 2) if extra_index else -1

    def batched(*operands: Any) -> Any:
        values = list(operands)
        for k, dims in lifted.items():
            values[k] = values[k].reshape(dims)
        for k, dims in wide.items():
            values[k] = np.broadcast_to(values[k], dims)
        if first >= 0:
            values.insert(first, _ZERO)
        return fn(*values)

    return batched


# -- once per member -----------------------------------------------------------------------------------

def _row(value: Any, stack: Stack, k: int) -> Any:
    if isinstance(stack, tuple):
        return tuple(_row(v, s, k) for v, s in zip(value, stack))
    return value[k, ...] if stack else value  # a 0-d row stays an array


def _stack_rows(rows: list[Any], stack: Stack) -> Any:
    if isinstance(stack, tuple):
        return tuple(_stack_rows([r[i] for r in rows], s) for i, s in enumerate(stack))
    return np.stack(rows) if stack else rows[0]


def _per_member(inst: Instruction, ctx: BatchedContext, stacks: list[Stack], out: Stack) -> Kernel:
    fn = lookup(inst)(inst, ctx)
    members = range(ctx.size)

    def each(*operands: Any) -> Any:
        return _stack_rows([fn(*[_row(v, s, k) for v, s in zip(operands, stacks)]) for k in members], out)

    return each


class _Member:
    """The context of one member, for the kernels whose value is the member's (replica-id)."""

    def __init__(self, ctx: BatchedContext, replica: int) -> None:
        self.module = ctx.module
        self.num_replicas = ctx.num_replicas
        self.replica_id = replica
        self._ctx = ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def _per_member_constant(inst: Instruction, ctx: BatchedContext) -> Kernel:
    value = np.stack([lookup(inst)(inst, _Member(ctx, m))() for m in ctx.members])
    value.flags.writeable = False
    return lambda: value


# -- control flow ----------------------------------------------------------------------------------------

def _agreed(value: Any, stacked: bool) -> Any:
    """A predicate or branch index all members computed: its one value, or `Divergent`."""
    if not stacked:
        return value
    first = value[0]
    if not (value == first).all():
        raise Divergent
    return first


def _while(inst: Instruction, ctx: BatchedContext, initial: Stack, state_stack: Stack) -> Kernel:
    analysis = ctx.analysis
    cond_name, body_name = inst.attrs["condition"], inst.attrs["body"]
    condition = ctx.batched(cond_name, (state_stack,))
    body = ctx.batched(body_name, (state_stack,))
    pred_stacked = any_stacked(analysis.root(cond_name, (state_stack,)))
    enter = promoter(initial, state_stack, ctx.size)
    again = promoter(analysis.root(body_name, (state_stack,)), state_stack, ctx.size)
    condition_run, body_run = condition, body

    def loop(state: Any) -> Any:
        if enter is not None:
            state = enter(state)
        while _agreed(condition_run(state), pred_stacked):
            state = body_run(state)
            if again is not None:
                state = again(state)
        return state

    return loop


def _conditional(inst: Instruction, ctx: BatchedContext, stacks: list[Stack], out: Stack) -> Kernel:
    names = conditional_branches(inst)
    analysis = ctx.analysis
    branches = []
    for k, name in enumerate(names):
        bound = ctx.batched(name, (stacks[k + 1],))
        lift = promoter(analysis.root(name, (stacks[k + 1],)), out, ctx.size)
        branches.append((bound, lift))
    index_stacked = any_stacked(stacks[0])
    indexed = "branch_computations" in inst.attrs
    last = len(branches) - 1

    def conditional(selector: Any, *args: Any) -> Any:
        value = _agreed(selector, index_stacked)
        if indexed:
            k = int(value)
            if k < 0 or k > last:
                k = last
        else:
            k = 0 if value else 1
        bound, lift = branches[k]
        result = bound(args[k])
        return result if lift is None else lift(result)

    return conditional


# -- collectives among the members -------------------------------------------------------------------

def _collective(inst: Instruction, ctx: BatchedContext, stacks: list[Stack], out: Stack) -> Kernel:
    run = _collective_values(inst, ctx, stacks, out)
    index = ctx.collective(inst)
    log = ctx.log.append
    clock = perf_counter_ns

    def collective(*operands: Any) -> Any:
        start = clock()
        value = run(*operands)
        log((index, start, clock()))
        return value

    return collective


def _collective_values(inst: Instruction, ctx: BatchedContext, stacks: list[Stack], out: Stack) -> Kernel:
    op = inst.opcode
    local = {m: k for k, m in enumerate(ctx.members)}
    size = ctx.size
    shapes = ctx.operand_shapes(inst)
    as_tuple = inst.shape.is_tuple

    def rows_of(operands: tuple, members: tuple[int, ...]) -> list[tuple]:
        return [tuple(v[local[m], ...] if s else v for v, s in zip(operands, stacks)) for m in members]

    if op == "collective-permute":
        pairs = verified_pairs(inst)
        moves = [(local[s], local[t]) for s, t in pairs if t in local]
        shape = inst.shape

        def permute(operand: np.ndarray) -> np.ndarray:
            result = np.zeros((size, *shape.dimensions), shape.dtype)
            for s, t in moves:
                result[t] = operand[s, ...] if stacks[0] else operand
            return result

        return permute
    # The members' groups, each once (interned: told apart by identity, not by comparing tuples).
    distinct: dict[int, tuple[int, ...]] = {}
    for group, _ in ctx.member_groups(inst):
        distinct.setdefault(id(group), group)
    groups = list(distinct.values())
    uniform = not any_stacked(out)
    results = list(inst.shape.tuple_shapes) if as_tuple else [inst.shape]
    dim = int(inst.attrs["dimensions"][0]) if inst.attrs.get("dimensions") else 0

    def assemble(per_group: list[tuple]) -> Any:
        """The operands' results of each group (one tuple per group) as the instruction's value."""
        if uniform:
            values = per_group[0]
        else:
            values = []
            for j, shape in enumerate(results):
                buf = np.empty((size, *shape.dimensions), shape.dtype)
                for g, group in enumerate(groups):
                    part = per_group[g][j]
                    if isinstance(part, list):  # one result per member of the group, in group order
                        for m, p in zip(group, part):
                            buf[local[m]] = p
                    else:
                        buf[[local[m] for m in group]] = part
                values.append(buf)
        return tuple(values) if as_tuple else values[0]

    if op in ("all-reduce", "reduce-scatter"):
        combine = make_combine(inst, ctx, [s.dtype for s in shapes])
        scatter = op == "reduce-scatter"
        if op == "all-reduce" and len(groups) == 1 and not set(groups[0]) <= set(local):
            # The group leaves the process: this process's partial, then the leaders' step.
            group = groups[0]
            here = tuple(m for m in group if m in local)
            fingerprint = ctx.collectives[ctx.collective(inst)][1][0][1]  # member 0's: the first member runs it

            def reduce_spanning(*operands: np.ndarray) -> Any:
                partial = batched_spanning.partial_of(rows_of(operands, here), combine)
                total = batched_spanning.all_reduce(ctx, inst, group, partial, combine, fingerprint)
                return tuple(total) if as_tuple else total[0]

            return reduce_spanning

        def reduce(*operands: np.ndarray) -> Any:
            per_group = []
            for group in groups:
                parts = rows_of(operands, group)
                if len(parts) == 1:
                    total = tuple(np.array(p) for p in parts[0])
                else:
                    total = reduce_into(tuple(np.empty(p.shape, p.dtype) for p in parts[0]), parts, combine)
                if scatter:
                    n = len(group)
                    total = tuple(list(np.split(t, n, axis=dim)) for t in total)
                per_group.append(total)
            return assemble(per_group)

        return reduce
    if op == "all-gather":
        def gather(*operands: np.ndarray) -> Any:
            per_group = []
            for group in groups:
                parts = rows_of(operands, group)
                per_group.append(tuple(np.concatenate([p[j] for p in parts], axis=dim) for j in range(len(shapes))))
            return assemble(per_group)

        return gather

    def all_to_all(*operands: np.ndarray) -> Any:  # the split form: chunk i of every member to member i
        per_group = []
        for group in groups:
            n = len(group)
            chunks = [tuple(np.split(v, n, axis=dim) for v in row) for row in rows_of(operands, group)]
            per_group.append(tuple([np.concatenate([chunks[j][v][i] for j in range(n)], axis=dim) for i in range(n)]
                                   for v in range(len(shapes))))
        return assemble(per_group)

    return all_to_all


__all__ = ["kernel_for", "full"]
