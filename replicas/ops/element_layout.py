"""Layout ops on per-element code (`ops.python_elements`): each result element is one of the operand's,
so broadcast, reshape, slice, transpose, reverse and concatenate are renamings made while generating."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from replicas.hlo.ir import Instruction
from replicas.shapes import PrimitiveType

P = PrimitiveType


class Refused(Exception):
    """The op has no per-element form here."""


def _strides(dims: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= d
    return strides[::-1]


def _indices(dims: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every multi-index of `dims`, row-major."""
    return list(itertools.product(*[range(d) for d in dims]))


def _flat(index: tuple[int, ...], dims: tuple[int, ...]) -> int:
    return sum(i * s for i, s in zip(index, _strides(dims)))


def layout(inst: Instruction, operands: list[Instruction], ins: list[list[str]],
           literal: Callable[[Any], str]) -> list[str]:
    """The elements of layout op `inst` (of element texts `ins`): a renaming of its operands' elements,
    or literals (iota); `Refused` for a bitcast between element types."""
    op = inst.opcode
    dims = tuple(inst.shape.dimensions)
    if op in ("reshape", "copy") or (op == "bitcast"
                                     and operands[0].shape.element_type is inst.shape.element_type):
        return list(ins[0])
    if op == "iota":
        d = inst.attrs["iota_dimension"]
        kind = inst.shape.element_type
        return [literal(float(i[d]) if kind in (P.F32, P.F64) else (i[d] != 0 if kind is P.PRED else i[d]))
                for i in _indices(dims)]
    src = tuple(operands[0].shape.dimensions) if operands else ()
    if op == "broadcast":
        mapping = list(inst.attrs.get("dimensions") or [])
        return [ins[0][_flat(tuple(i[d] for d in mapping), src)] for i in _indices(dims)]
    if op == "slice":
        spec = inst.attrs["slice"]
        return [ins[0][_flat(tuple(s[0] + i[k] * s[2] for k, s in enumerate(spec)), src)] for i in _indices(dims)]
    if op == "transpose":
        perm = list(inst.attrs["dimensions"])
        out = []
        for i in _indices(dims):
            source = [0] * len(perm)
            for k, p in enumerate(perm):
                source[p] = i[k]
            out.append(ins[0][_flat(tuple(source), src)])
        return out
    if op == "reverse":
        flip = set(inst.attrs["dimensions"])
        return [ins[0][_flat(tuple(src[k] - 1 - x if k in flip else x for k, x in enumerate(i)), src)]
                for i in _indices(dims)]
    if op == "concatenate":
        axis = inst.attrs["dimensions"][0]
        out = []
        for i in _indices(dims):
            offset = i[axis]
            for o, elems in zip(operands, ins):
                size = o.shape.dimensions[axis]
                if offset < size:
                    out.append(elems[_flat((*i[:axis], offset, *i[axis + 1:]), tuple(o.shape.dimensions))])
                    break
                offset -= size
        return out
    raise Refused  # a bitcast between element types
