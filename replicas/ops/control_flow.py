"""Computations that run other computations: call, fusion, while, conditional, map, async-start/-update/-done.

Called computations come bound from the context (`ctx.computation(name)` -> `fn(*args)`), so a
call or a fusion is the bound computation itself and a while loop is a bare Python loop over
two bound computations: nothing else runs per iteration.

Map evaluates its scalar computation once on the whole operand arrays (every op of a scalar
computation is element-wise).

async-start runs the wrapped computation at once. Its value is the tuple
`(operands, result, *contexts)`: a tuple of the operand values, the computation's result, and
one zero scalar per context element of the async-start's shape (XLA's `((operands), result,
s32[])`). async-update passes that tuple on; async-done returns its `result` element.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.hlo.ir import Computation, Instruction
from replicas.ops.python_elements import compile_fusion, compile_loop
from replicas.ops.python_scalars import loop_scalars
from replicas.ops.registry import Kernel, KernelContext, kernel


@kernel("call", "fusion")
def make_call(inst: Instruction, ctx: KernelContext) -> Kernel:
    bound = ctx.computation(inst.attrs["to_apply" if inst.opcode == "call" else "calls"])
    if inst.opcode == "fusion":
        # A fusion of a few elements: Python per element beats a numpy call per op.
        small = compile_fusion(ctx.computation_ir(inst.attrs["calls"]), ctx)
        if small is not None:
            small.plain = bound  # type: ignore[attr-defined]  # what a recorded run steps through
            return small
    return bound


@kernel("while")
def make_while(inst: Instruction, ctx: KernelContext) -> Callable[[Any], Any]:
    loop = _bound_loop(inst, ctx)
    # A loop of a few elements: one Python loop over them, without a numpy call per op.
    small = compile_loop(inst, ctx)
    if small is None:
        return loop
    small.plain = loop  # type: ignore[attr-defined]  # what a recorded run steps through
    return small


def _bound_loop(inst: Instruction, ctx: KernelContext) -> Callable[[Any], Any]:
    cond_name, body_name = inst.attrs["condition"], inst.attrs["body"]
    cond_ir = ctx.computation_ir(cond_name)
    # The loop's integer and pred scalars (its counter, its condition) as Python numbers.
    scalars = loop_scalars(ctx.module, inst.shape, cond_ir, ctx.computation_ir(body_name))
    condition = ctx.computation(cond_name, scalars=scalars)
    # The loop owns its state: the body may update state arrays in place (a scan's accumulator)
    # instead of copying them every iteration. Elements the condition reads are never given away,
    # nor Python numbers (nothing to own).
    donation = frozenset(d for d in _state_donation(inst, cond_ir) if d[1] not in scalars)
    body = ctx.computation(body_name, donation, scalars=scalars)
    updated = sorted(i for _, i in body.updated_in_place if i is not None)
    loop = condition.loop  # the loop of a bound condition and body, without per-call checks
    if not updated:
        return lambda state: loop(body, state)

    def own(state: tuple, entry: bool) -> tuple:
        return _owning(state, updated, entry=entry)

    return lambda state: loop(body, state, own)


def _state_donation(inst: Instruction, cond_ir: Computation) -> frozenset:
    """(0, i) for every array element i of the loop state the condition does not read."""
    if not inst.shape.is_tuple:
        return frozenset()
    param = cond_ir.parameters[0].name
    readers = [i for i in cond_ir.instructions if param in i.operands]
    if any(i.opcode != "get-tuple-element" for i in readers):
        return frozenset()
    read = {i.attrs.get("index") for i in readers}
    return frozenset((0, k) for k, s in enumerate(inst.shape.tuple_shapes) if s.is_array and k not in read)


def _owning(state: tuple, updated: list[int], *, entry: bool) -> tuple:
    """`state` with its elements `updated` owned by the loop: copied on entry (the caller's arrays),
    and later when one is a view, is read-only (a constant's value, which every run shares) or
    shares its buffer with another element (the very same array, or a view of it)."""
    if entry:
        values = list(state)
        for i in updated:
            values[i] = np.array(values[i], copy=True)
        return tuple(values)
    copied: list | None = None  # the state, once an element had to be copied
    for i in updated:
        x = state[i]
        owned = x.base is None and x.flags.writeable
        if owned:
            for j, y in enumerate(state):
                if j != i and (y is x or (type(y) is np.ndarray and y.base is not None and np.may_share_memory(x, y))):
                    owned = False
                    break
        if not owned:
            if copied is None:
                copied = list(state)
            copied[i] = np.array(x, copy=True)
    return state if copied is None else tuple(copied)


@kernel("conditional")
def make_conditional(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    """Pred form runs true_computation(operand 1) or false_computation(operand 2); the index form
    runs branch_computations[i](operand i+1), with an out-of-range index running the last branch."""
    if "branch_computations" in inst.attrs:
        branches = tuple(ctx.computation(name) for name in inst.attrs["branch_computations"])
        last = len(branches) - 1

        def indexed(index: np.ndarray, *args: Any) -> Any:
            k = int(index)
            if k < 0 or k > last:
                k = last
            return branches[k](args[k])

        return indexed
    on_true = ctx.computation(inst.attrs["true_computation"])
    on_false = ctx.computation(inst.attrs["false_computation"])

    def predicated(pred: np.ndarray, true_arg: Any, false_arg: Any) -> Any:
        return on_true(true_arg) if pred else on_false(false_arg)

    return predicated


@kernel("map")
def make_map(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    out_dims = inst.shape.dimensions
    fn = ctx.computation(inst.attrs["to_apply"])
    dtype = inst.shape.dtype

    def map_(*xs: np.ndarray) -> np.ndarray:
        result = fn(*xs)
        if result.shape != out_dims:  # a computation that ignores its parameters returns a scalar
            result = np.broadcast_to(result, out_dims)
        if result.dtype != dtype:
            result = result.astype(dtype)
        return result

    return map_


@kernel("async-start")
def make_async_start(inst: Instruction, ctx: KernelContext) -> Callable[..., tuple]:
    fn = ctx.computation(inst.attrs["calls"])
    shape = inst.shape
    contexts = tuple(np.zeros((), s.dtype) if s.is_array else None for s in shape.tuple_shapes[2:])

    def async_start(*args: Any) -> tuple:
        return (args, fn(*args), *contexts)

    return async_start


@kernel("async-update")
def make_async_update(inst: Instruction, ctx: KernelContext) -> Callable[[tuple], tuple]:
    def async_update(started: tuple) -> tuple:
        return started

    return async_update


@kernel("async-done")
def make_async_done(inst: Instruction, ctx: KernelContext) -> Callable[[tuple], Any]:
    def async_done(started: tuple) -> Any:
        return started[1]

    return async_done
