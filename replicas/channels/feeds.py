"""Infeed and outfeed: values the host queues for a replica, and values a replica writes for the host.

An infeed's result is `(data, token)`. The host value must match the data shape: a numpy array of
the exact dtype and dimensions (Python scalars and lists are converted), raw `bytes` laid out as
the shape's layout says (decoded by `replicas.layout.from_bytes`), or a tuple of such values for a
tuple shape. Nested tuple shapes are rejected, as XLA does; the empty tuple reads nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.errors import ProgramError
from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, kernel
from replicas.records import BlockInfo
from replicas.shapes import TOKEN, Shape


def describe_value(value: Any) -> str:
    if isinstance(value, np.ndarray):
        try:
            return str(Shape.of(value))
        except ProgramError:
            return f"array {value.dtype}{list(value.shape)}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{len(value)} bytes"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def host_value_checker(inst: Instruction, replica: int, shape: Shape, what: str) -> Callable[[Any], Any]:
    """`check(value) -> value` for values the host gives to a replica for `shape`."""

    def fail(value: Any, detail: str = "") -> ProgramError:
        extra = f" ({detail})" if detail else ""
        return inst.error(f"replica {replica}: {what} expects {shape}, got {describe_value(value)}{extra}")

    def check_leaf(leaf: Shape, value: Any, whole: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            from replicas.layout import from_bytes

            try:
                return from_bytes(value, leaf)
            except ProgramError as e:
                raise fail(whole, str(e)) from None
        if isinstance(value, np.ndarray):
            if value.dtype != leaf.dtype or value.shape != leaf.dimensions:
                raise fail(whole)
            return value
        if isinstance(value, (bool, int, float, complex, list, np.generic)):
            try:
                arr = np.asarray(value, dtype=leaf.dtype)
            except (TypeError, ValueError, OverflowError) as e:
                raise fail(whole, str(e)) from None
            if arr.shape != leaf.dimensions:
                raise fail(whole)
            return arr
        raise fail(whole)

    if shape.is_tuple:
        leaves = shape.tuple_shapes

        def check_tuple(value: Any) -> Any:
            if isinstance(value, (bytes, bytearray, memoryview)):
                from replicas.layout import from_bytes

                try:
                    return from_bytes(value, shape)
                except ProgramError as e:
                    raise fail(value, str(e)) from None
            if not isinstance(value, (tuple, list)) or len(value) != len(leaves):
                raise fail(value)
            return tuple(check_leaf(s, v, value) for s, v in zip(leaves, value))

        return check_tuple
    if shape.is_token:
        return lambda value: TOKEN
    return lambda value: check_leaf(shape, value, value)


def reject_nested_tuple(inst: Instruction, shape: Shape) -> None:
    if shape.is_tuple and any(s.is_tuple for s in shape.tuple_shapes):
        raise inst.error(f"{inst.opcode} of a nested tuple shape {shape} is not supported (XLA rejects it)")


@kernel("infeed")
def make_infeed(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    data_shape = inst.shape.tuple_shapes[0]  # the shape rule checked (data, token)
    reject_nested_tuple(inst, data_shape)
    if data_shape.is_tuple and not data_shape.tuple_shapes:
        return lambda *token: ((), TOKEN)
    fabric = ctx.fabric
    check = host_value_checker(inst, ctx.replica_id, data_shape, "infeed")
    name, opcode = inst.name, inst.opcode
    from replicas.collectives.kernels import computation_of

    computation = computation_of(ctx, inst)

    def infeed(*token: Any) -> Any:
        block = BlockInfo("infeed", name, opcode, needs="one", computation=computation)
        recorder = fabric.recorder
        event = recorder.begin("infeed", name, opcode) if recorder is not None else None
        value = fabric.infeed(block)
        if event is not None:
            recorder.end(event, seq=block.seq)
        return (check(value), TOKEN)

    return infeed


@kernel("outfeed")
def make_outfeed(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    fabric = ctx.fabric
    name, opcode = inst.name, inst.opcode

    def outfeed(value: Any, *token: Any) -> Any:
        recorder = fabric.recorder
        if recorder is not None:
            recorder.end(recorder.begin("outfeed", name, opcode))
        fabric.outfeed(value)
        return TOKEN

    return outfeed
