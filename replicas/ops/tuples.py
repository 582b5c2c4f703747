"""Tuples, tokens and pass-through ops: tuple, get-tuple-element, after-all, add-dependency,
opt-barrier, domain, copy-start/copy-done.

Ordering ops (after-all, add-dependency, opt-barrier) only order the schedule, which already runs
in program order, so at run time they pass values through. copy-start's value is the tuple XLA
gives it, (destination, source, u32 context); values are never written, so the "copy" shares the
source's memory.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import TOKEN, Token


@kernel("tuple")
def make_tuple(inst: Instruction, ctx: KernelContext) -> Callable[..., tuple]:
    if not inst.shape.is_tuple:
        raise inst.error(f"tuple result must be a tuple shape, got {inst.shape}")
    if len(inst.shape.tuple_shapes) != len(inst.operands):
        raise inst.error(f"result shape {inst.shape} has {len(inst.shape.tuple_shapes)} elements, "
                         f"the tuple has {len(inst.operands)} operands")

    def tuple_(*values: Any) -> tuple:
        return values

    return tuple_


@kernel("get-tuple-element")
def make_get_tuple_element(inst: Instruction, ctx: KernelContext) -> Callable[[tuple], Any]:
    if len(inst.operands) != 1:
        raise inst.error(f"get-tuple-element takes 1 operand, got {len(inst.operands)}")
    (operand,) = ctx.operand_shapes(inst)
    if not operand.is_tuple:
        raise inst.error(f"operand must be a tuple, got {operand}")
    index = inst.attrs.get("index")
    if index is None:
        raise inst.error("missing attribute index")
    index = int(index)
    if not 0 <= index < len(operand.tuple_shapes):
        raise inst.error(f"index {index} out of range for a tuple of {len(operand.tuple_shapes)} elements")

    return operator.itemgetter(index)  # C-level indexing: the cheapest kernel in while-loop bodies


@kernel("after-all")
def make_after_all(inst: Instruction, ctx: KernelContext) -> Callable[..., Token]:
    for s in ctx.operand_shapes(inst):
        if not s.is_token:
            raise inst.error(f"after-all operands must be tokens, got {s}")

    def after_all(*tokens: Token) -> Token:
        return TOKEN

    return after_all


@kernel("add-dependency")
def make_add_dependency(inst: Instruction, ctx: KernelContext) -> Callable[[Any, Token], Any]:
    """The first operand, ordered after the token (the schedule keeps program order)."""
    if len(inst.operands) != 2:
        raise inst.error(f"add-dependency takes 2 operands (value, token), got {len(inst.operands)}")

    def add_dependency(value: Any, token: Token) -> Any:
        return value

    return add_dependency


def _pass_through(inst: Instruction) -> Callable[[Any], Any]:
    if len(inst.operands) != 1:
        raise inst.error(f"{inst.opcode} takes 1 operand, got {len(inst.operands)}")

    def identity(value: Any) -> Any:
        return value

    return identity


@kernel("opt-barrier")
def make_opt_barrier(inst: Instruction, ctx: KernelContext) -> Callable[[Any], Any]:
    return _pass_through(inst)


@kernel("domain")
def make_domain(inst: Instruction, ctx: KernelContext) -> Callable[[Any], Any]:
    return _pass_through(inst)


@kernel("copy-start")
def make_copy_start(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple]:
    if len(inst.operands) != 1:
        raise inst.error(f"copy-start takes 1 operand, got {len(inst.operands)}")
    shape = inst.shape
    if not shape.is_tuple or len(shape.tuple_shapes) < 2:
        raise inst.error(f"copy-start result must be (destination, source, context), got {shape}")
    context = tuple(np.zeros((), s.dtype) for s in shape.tuple_shapes[2:] if s.is_array)

    def copy_start(x: np.ndarray) -> tuple:
        return (x, x, *context)

    return copy_start


@kernel("copy-done")
def make_copy_done(inst: Instruction, ctx: KernelContext) -> Callable[[tuple], np.ndarray]:
    if len(inst.operands) != 1:
        raise inst.error(f"copy-done takes 1 operand (the copy-start), got {len(inst.operands)}")
    (operand,) = ctx.operand_shapes(inst)
    if not operand.is_tuple:
        raise inst.error(f"copy-done operand must be copy-start's tuple, got {operand}")

    def copy_done(started: tuple) -> np.ndarray:
        return started[0]

    return copy_done
