"""The machinery shared by the shape-inference rule families: the rule registry, the context a rule
reads (operand shapes, attributes, called computations, the declared result), and small checks.

A rule returns the inferred result `Shape`, or None when the instruction itself gives the result
(parameter, constant, reshape, ...); it then checks what it can against the declared result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation
from replicas.limits import missing_ids, short_text
from replicas.name_table import registrar
from replicas.shapes import PrimitiveType, Shape

PRED = PrimitiveType.PRED
S32 = PrimitiveType.S32
U32 = PrimitiveType.U32


@dataclass
class Ctx:
    opcode: str
    operands: list[Shape]
    attrs: dict[str, Any]
    computations: Callable[[str], Computation]
    result: Shape | None
    num_replicas: int | None

    def fail(self, message: str) -> ProgramError:
        return ProgramError(f"{self.opcode}: {message}")

    def attr(self, name: str, default: Any = ...) -> Any:
        if name in self.attrs and self.attrs[name] is not None:
            return self.attrs[name]
        if default is ...:
            raise self.fail(f"missing attribute {name!r}")
        return default

    def int_list(self, name: str, default: Any = ...) -> list[int]:
        value = self.attr(name, default)
        try:
            return [int(v) for v in value]
        except (TypeError, ValueError):
            raise self.fail(f"attribute {name!r} must be a list of integers, got {value!r}") from None

    def count(self, *allowed: int, at_least: int | None = None) -> None:
        n = len(self.operands)
        if at_least is not None:
            if n < at_least:
                raise self.fail(f"expects at least {at_least} operands, got {n}")
        elif n not in allowed:
            want = " or ".join(map(str, allowed))
            raise self.fail(f"expects {want} operand{'s' if allowed != (1,) else ''}, got {n}")

    def array(self, i: int, what: str | None = None) -> Shape:
        s = self.operands[i]
        if not s.is_array:
            raise self.fail(f"{what or f'operand {i}'} must be an array, got {s}")
        return s

    def token(self, i: int, what: str | None = None) -> Shape:
        s = self.operands[i]
        if not s.is_token:
            raise self.fail(f"{what or f'operand {i}'} must be a token, got {s}")
        return s

    def computation(self, attr: str) -> Computation:
        name = self.attr(attr)
        if not isinstance(name, str):
            raise self.fail(f"attribute {attr!r} must name a computation, got {name!r}")
        try:
            return self.computations(name)
        except ProgramError:
            raise self.fail(f"called computation {name!r} ({attr}) does not exist") from None
        except KeyError:
            raise self.fail(f"called computation {name!r} ({attr}) does not exist") from None

    def computation_named(self, name: str, what: str) -> Computation:
        try:
            return self.computations(name)
        except (ProgramError, KeyError):
            raise self.fail(f"called computation {name!r} ({what}) does not exist") from None


Rule = Callable[[Ctx], "Shape | None"]
RULES: dict[str, Rule] = {}


rule = registrar(RULES, "shape rule")


# -- small helpers ------------------------------------------------------------------------------

def same_dims(a: Shape, b: Shape) -> bool:
    return a.dimensions == b.dimensions


def compatible(a: Shape, b: Shape) -> bool:
    """Equal ignoring layouts and dynamic flags."""
    return a.compatible(b)


def array_shape(element_type: PrimitiveType, dims: Sequence[int]) -> Shape:
    return Shape.array(element_type, tuple(int(d) for d in dims))


def scalar(element_type: PrimitiveType) -> Shape:
    return Shape.array(element_type, ())


def tuple_or_single(shapes: list[Shape]) -> Shape:
    return shapes[0] if len(shapes) == 1 else Shape.tuple(shapes)


def check_dims_unique_in_range(c: Ctx, dims: Sequence[int], rank: int, what: str, *,
                               sorted_required: bool = False) -> None:
    for d in dims:
        if not 0 <= d < rank:
            raise c.fail(f"{what} {list(dims)}: dimension {d} out of range for rank {rank}")
    if len(set(dims)) != len(dims):
        raise c.fail(f"{what} {list(dims)} has a repeated dimension")
    if sorted_required and list(dims) != sorted(dims):
        raise c.fail(f"{what} {list(dims)} must be sorted")


def window_output_size(c: Ctx, base: int, size: int, stride: int, pad: tuple[int, int], lhs_dilate: int,
                       rhs_dilate: int, dim: int) -> int:
    """XLA's InferWindowOutputShape for one dimension (StridedBound of the padded dilated base)."""
    if size < 0:
        raise c.fail(f"window size {size} in dimension {dim} is negative")
    if stride < 1:
        raise c.fail(f"window stride {stride} in dimension {dim} must be positive")
    if lhs_dilate < 1 or rhs_dilate < 1:
        raise c.fail(f"window dilation in dimension {dim} must be positive")
    dilated_base = 0 if base == 0 else (base - 1) * lhs_dilate + 1
    padded = dilated_base + pad[0] + pad[1]
    dilated_window = 0 if size == 0 else (size - 1) * rhs_dilate + 1
    if padded < 0:
        # JAX's reduce-window shape rule yields an empty dimension; its convolution rejects it.
        if c.opcode != "convolution":
            return 0
        raise c.fail(f"padding {tuple(pad)} in dimension {dim} leaves a negative size")
    if dilated_window > padded:
        return 0
    return (padded - dilated_window) // stride + 1


def check_window(c: Ctx, window: Any, rank: int) -> dict[str, list]:
    if not isinstance(window, dict):
        raise c.fail(f"window must be a dict, got {window!r}")
    n = len(window.get("size", []))
    out: dict[str, list] = {}
    defaults = {"size": 1, "stride": 1, "lhs_dilate": 1, "rhs_dilate": 1, "pad": (0, 0), "window_reversal": False}
    for key, default in defaults.items():
        value = window.get(key)
        value = [default] * n if value is None else list(value)
        if len(value) != n:
            raise c.fail(f"window {key} has {len(value)} entries, expected {n}")
        out[key] = value
    if n != rank:
        raise c.fail(f"window has {n} dimensions, expected {rank}")
    for i in range(n):
        if out["size"][i] < 1 and c.opcode != "convolution":
            raise c.fail(f"window size {out['size'][i]} in dimension {i} must be positive")
        if out["stride"][i] < 1:
            raise c.fail(f"window stride {out['stride'][i]} in dimension {i} must be positive")
        if out["lhs_dilate"][i] < 1 or out["rhs_dilate"][i] < 1:
            raise c.fail(f"window dilation in dimension {i} must be positive")
    return out


def check_scalar_computation(c: Ctx, comp: Computation, param_types: list[PrimitiveType],
                             result_types: list[PrimitiveType] | None, what: str,
                             loose_from: int | None = None) -> None:
    """`comp` takes scalars of `param_types` and returns scalars of `result_types` (a tuple if > 1).
    Parameters from index `loose_from` on may differ in floating-point precision (XLA's reducers)."""
    params = comp.parameter_shapes
    if len(params) != len(param_types):
        raise c.fail(f"{what} {comp.name} takes {len(params)} parameters, expected {len(param_types)}")
    for i, (p, t) in enumerate(zip(params, param_types)):
        loose = loose_from is not None and i >= loose_from and p.is_array and p.element_type.is_floating \
            and t.is_floating
        if not (p.is_array and p.is_scalar and (p.element_type is t or loose)):
            raise c.fail(f"{what} {comp.name} parameter {i} is {p}, expected {t.value}[]")
    if result_types is None:
        return
    result = comp.result_shape
    want = tuple_or_single([scalar(t) for t in result_types])
    if not compatible(result, want):
        raise c.fail(f"{what} {comp.name} returns {result}, expected {want}")


def check_param_shapes(c: Ctx, comp: Computation, shapes: list[Shape], what: str) -> None:
    params = comp.parameter_shapes
    if len(params) != len(shapes):
        raise c.fail(f"{what} {comp.name} takes {len(params)} parameters, but {len(shapes)} operands are given")
    for i, (p, s) in enumerate(zip(params, shapes)):
        if not compatible(p, s):
            raise c.fail(f"{what} {comp.name} parameter {i} is {p}, but the operand is {s}")


def second_of_start(c: Ctx) -> Shape:
    """The result of a -done op whose start returned (operands, result, ...)."""
    s = c.operands[0]
    if not s.is_tuple or len(s.tuple_shapes) < 2:
        raise c.fail(f"operand must be the tuple produced by the matching start, got {s}")
    return s.tuple_shapes[1]


def replica_groups(c: Ctx) -> list[list[int]]:
    groups = c.attrs.get("replica_groups") or []
    try:
        return [[int(x) for x in g] for g in groups]
    except (TypeError, ValueError):
        raise c.fail(f"replica_groups must be a list of lists of integers, got {groups!r}") from None


def check_replica_groups(c: Ctx, *, uniform: bool) -> int | None:
    """Validate replica_groups; return the group size when known (else None)."""
    groups = replica_groups(c)
    n = c.num_replicas
    if not groups:
        return n
    seen: set[int] = set()
    for g in groups:
        if not g:
            raise c.fail("replica_groups has an empty group")
        for r in g:
            if r < 0 or (n is not None and r >= n):
                raise c.fail(f"replica_groups {short_text(groups)}: id {r} out of range"
                             + (f" for {n} replicas" if n is not None else ""))
            if r in seen:
                raise c.fail(f"replica_groups {short_text(groups)}: id {r} appears more than once")
            seen.add(r)
    if n is not None and len(seen) != n:
        raise c.fail(f"replica_groups {short_text(groups)} do not cover every one of the {n} replicas "
                     f"(missing {missing_ids(seen, n)})")
    sizes = {len(g) for g in groups}
    if uniform and len(sizes) != 1:
        raise c.fail(f"replica_groups {short_text(groups)} must all have the same size")
    return len(groups[0]) if len(sizes) == 1 else None
