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
    def tuple_(*values: Any) -> tuple:
        return values

    return tuple_


@kernel("get-tuple-element")
def make_get_tuple_element(inst: Instruction, ctx: KernelContext) -> Callable[[tuple], Any]:
    return operator.itemgetter(int(inst.attrs["index"]))  # C-level indexing: the cheapest kernel in while-loop bodies


@kernel("after-all")
def make_after_all(inst: Instruction, ctx: KernelContext) -> Callable[..., Token]:
    def after_all(*tokens: Token) -> Token:
        return TOKEN

    return after_all


@kernel("add-dependency")
def make_add_dependency(inst: Instruction, ctx: KernelContext) -> Callable[[Any, Token], Any]:
    """The first operand, ordered after the token (the schedule keeps program order)."""
    def add_dependency(value: Any, token: Token) -> Any:
        return value

    return add_dependency


def _identity(value: Any) -> Any:
    return value


@kernel("opt-barrier", "domain")
def make_pass_through(inst: Instruction, ctx: KernelContext) -> Callable[[Any], Any]:
    return _identity


@kernel("copy-start")
def make_copy_start(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], tuple]:
    shape = inst.shape
    context = tuple(np.zeros((), s.dtype) for s in shape.tuple_shapes[2:] if s.is_array)

    def copy_start(x: np.ndarray) -> tuple:
        return (x, x, *context)

    return copy_start


@kernel("copy-done")
def make_copy_done(inst: Instruction, ctx: KernelContext) -> Callable[[tuple], np.ndarray]:
    def copy_done(started: tuple) -> np.ndarray:
        return started[0]

    return copy_done
