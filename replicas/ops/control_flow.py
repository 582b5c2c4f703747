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
from replicas.ops.registry import Kernel, KernelContext, kernel


def _called(inst: Instruction, ctx: KernelContext, attr: str, num_args: int) -> tuple[Kernel, Computation]:
    name = inst.attrs.get(attr)
    if not isinstance(name, str):
        raise inst.error(f"missing attribute {attr} (the called computation)")
    comp = ctx.computation_ir(name)
    n = len(comp.parameters)
    if n != num_args:
        raise inst.error(f"computation {name} takes {n} parameter{'s' if n != 1 else ''}, "
                         f"given {num_args} operand{'s' if num_args != 1 else ''}")
    return ctx.computation(name), comp


@kernel("call")
def make_call(inst: Instruction, ctx: KernelContext) -> Kernel:
    fn, _ = _called(inst, ctx, "to_apply", len(inst.operands))
    return fn


@kernel("fusion")
def make_fusion(inst: Instruction, ctx: KernelContext) -> Kernel:
    fn, _ = _called(inst, ctx, "calls", len(inst.operands))
    return fn


@kernel("while")
def make_while(inst: Instruction, ctx: KernelContext) -> Callable[[Any], Any]:
    if len(inst.operands) != 1:
        raise inst.error(f"while takes 1 operand (the initial state), got {len(inst.operands)}")
    condition, cond_ir = _called(inst, ctx, "condition", 1)
    body, body_ir = _called(inst, ctx, "body", 1)
    cond_result = cond_ir.result_shape
    if not (cond_result.is_scalar and cond_result.element_type.value == "pred"):
        raise inst.error(f"condition {cond_ir.name} must return pred[], returns {cond_result}")
    if not body_ir.result_shape.compatible(inst.shape):
        raise inst.error(f"body {body_ir.name} returns {body_ir.result_shape}, the loop state is {inst.shape}")
    # The loop owns its state: the body may update state arrays in place (a scan's accumulator)
    # instead of copying them every iteration. Elements the condition reads are never given away.
    donation = _state_donation(inst, cond_ir)
    if donation and hasattr(ctx, "computation"):
        body = ctx.computation(body_ir.name, donation)
    updated = sorted(i for _, i in getattr(body, "updated_in_place", ()) if i is not None)
    if not updated:
        def while_(state: Any) -> Any:
            while condition(state):
                state = body(state)
            return state

        return while_

    def owned_while(state: Any) -> Any:
        state = _owning(state, updated, entry=True)
        while condition(state):
            state = _owning(body(state), updated, entry=False)
        return state

    return owned_while


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
    and later when one is a view or shares its buffer with another element."""
    values = list(state)
    for i in updated:
        x = values[i]
        if entry or x.base is not None or any(
                y is x or (type(y) is np.ndarray and y.base is not None and np.may_share_memory(x, y))
                for j, y in enumerate(values) if j != i):
            values[i] = np.array(x, copy=True)
    return tuple(values)


@kernel("conditional")
def make_conditional(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    """Pred form runs true_computation(operand 1) or false_computation(operand 2); the index form
    runs branch_computations[i](operand i+1), with an out-of-range index running the last branch."""
    shapes = ctx.operand_shapes(inst)
    if not shapes or not shapes[0].is_scalar:
        raise inst.error("conditional's first operand must be a pred or s32 scalar")
    selector = shapes[0].element_type.value
    if "branch_computations" in inst.attrs:
        names = list(inst.attrs["branch_computations"])
        if selector != "s32":
            raise inst.error(f"branch_computations needs an s32 branch index, got {shapes[0]}")
        if not names:
            raise inst.error("branch_computations is empty")
        if len(shapes) != len(names) + 1:
            raise inst.error(f"{len(names)} branches need {len(names) + 1} operands, got {len(shapes)}")
        branches = tuple(_branch(inst, ctx, name) for name in names)
        last = len(branches) - 1

        def indexed(index: np.ndarray, *args: Any) -> Any:
            k = int(index)
            if k < 0 or k > last:
                k = last
            return branches[k](args[k])

        return indexed
    if selector != "pred":
        raise inst.error(f"true_computation/false_computation need a pred selector, got {shapes[0]}")
    if len(shapes) != 3:
        raise inst.error(f"the pred form takes 3 operands (pred, true operand, false operand), got {len(shapes)}")
    for attr in ("true_computation", "false_computation"):
        if not isinstance(inst.attrs.get(attr), str):
            raise inst.error(f"missing attribute {attr}")
    on_true = _branch(inst, ctx, inst.attrs["true_computation"])
    on_false = _branch(inst, ctx, inst.attrs["false_computation"])

    def predicated(pred: np.ndarray, true_arg: Any, false_arg: Any) -> Any:
        return on_true(true_arg) if pred else on_false(false_arg)

    return predicated


def _branch(inst: Instruction, ctx: KernelContext, name: str) -> Kernel:
    comp = ctx.computation_ir(name)
    if len(comp.parameters) != 1:
        raise inst.error(f"branch computation {name} must take 1 parameter, takes {len(comp.parameters)}")
    if not comp.result_shape.compatible(inst.shape):
        raise inst.error(f"branch computation {name} returns {comp.result_shape}, the conditional {inst.shape}")
    return ctx.computation(name)


@kernel("map")
def make_map(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    shapes = ctx.operand_shapes(inst)
    if not shapes:
        raise inst.error("map needs at least one operand")
    out_dims = inst.shape.dimensions
    for s in shapes:
        if not s.is_array or s.dimensions != out_dims:
            raise inst.error(f"every map operand must have the result's dimensions {list(out_dims)}, got {s}")
    dims = [int(d) for d in inst.attrs.get("dimensions", range(len(out_dims)))]
    if dims != list(range(len(out_dims))):
        raise inst.error(f"map dimensions must be all dimensions in order, got {dims}")
    fn, comp = _called(inst, ctx, "to_apply", len(shapes))
    for p, s in zip(comp.parameters, shapes):
        if not p.shape.is_scalar or p.shape.element_type is not s.element_type:
            raise inst.error(f"map computation {comp.name} parameter %{p.name} must be a "
                             f"{s.element_type.value} scalar, is {p.shape}")
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
    fn, _ = _called(inst, ctx, "calls", len(inst.operands))
    shape = inst.shape
    if not shape.is_tuple or len(shape.tuple_shapes) < 2:
        raise inst.error(f"async-start result must be ((operands), result, context...), got {shape}")
    contexts = tuple(np.zeros((), s.dtype) if s.is_array else None for s in shape.tuple_shapes[2:])

    def async_start(*args: Any) -> tuple:
        return (args, fn(*args), *contexts)

    return async_start


@kernel("async-update")
def make_async_update(inst: Instruction, ctx: KernelContext) -> Callable[[tuple], tuple]:
    if len(inst.operands) != 1:
        raise inst.error(f"async-update takes 1 operand (the async-start), got {len(inst.operands)}")

    def async_update(started: tuple) -> tuple:
        return started

    return async_update


@kernel("async-done")
def make_async_done(inst: Instruction, ctx: KernelContext) -> Callable[[tuple], Any]:
    if len(inst.operands) != 1:
        raise inst.error(f"async-done takes 1 operand (the async-start), got {len(inst.operands)}")

    def async_done(started: tuple) -> Any:
        return started[1]

    return async_done
