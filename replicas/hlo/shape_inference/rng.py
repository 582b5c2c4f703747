"""Shape rules of the random-number ops: rng, rng-bit-generator, rng-get-and-update-state."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    PRED,
    Ctx,
    array_shape,
    compatible,
    rule,
)
from replicas.shapes import PrimitiveType, Shape

U64 = PrimitiveType.U64


@rule("rng")
def _rng(c: Ctx) -> None:
    c.count(2, 3)
    a, b = c.array(0, "a"), c.array(1, "b")
    if len(c.operands) == 3:  # XLA's optional third operand: the result dimensions, s64[rank]
        dims = c.array(2, "shape")
        if dims.rank != 1 or not dims.element_type.is_integral:
            raise c.fail(f"the third operand gives the result dimensions as an integer vector, got {dims}")
    dist = c.attr("distribution")
    if not (a.is_scalar and b.is_scalar and a.element_type is b.element_type):
        raise c.fail(f"parameters {a} and {b} must be scalars of the same type")
    t = a.element_type
    if dist == "rng_normal" and not t.is_floating:
        raise c.fail(f"rng_normal needs floating-point parameters, got {t.value}")
    if dist == "rng_uniform" and not (t.is_floating or t.is_integral or t is PRED):
        raise c.fail(f"rng_uniform needs numeric parameters, got {t.value}")
    if dist not in ("rng_normal", "rng_uniform"):
        raise c.fail(f"distribution must be rng_uniform or rng_normal, got {dist!r}")
    r = c.result
    if r is not None and (not r.is_array or r.element_type is not t):
        raise c.fail(f"result {r} must be an array of the parameters' type {t.value}")
    return None


@rule("rng-bit-generator")
def _rng_bit_generator(c: Ctx) -> None:
    state = c.array(0, "state")
    if state.rank != 1 or state.element_type is not U64:
        raise c.fail(f"state {state} must be a u64 vector")
    algorithm = c.attr("algorithm", "rng_default")
    if algorithm not in ("rng_default", "rng_three_fry", "rng_philox"):
        raise c.fail(f"unknown algorithm {algorithm!r}")
    lengths = (2,) if algorithm == "rng_three_fry" else (2, 3)  # rng_default is Philox, as on XLA:CPU
    if state.dimensions[0] not in lengths:
        raise c.fail(f"{algorithm} needs a state of {' or '.join(f'u64[{n}]' for n in lengths)}, got {state}")
    r = c.result
    if r is not None:
        if not (r.is_tuple and len(r.tuple_shapes) == 2 and compatible(r.tuple_shapes[0], state)
                and r.tuple_shapes[1].is_array):
            raise c.fail(f"result must be (state {state}, data), got {r}")
        t = r.tuple_shapes[1].element_type
        if not (t.is_integral or t.is_floating) or r.tuple_shapes[1].dtype.itemsize not in (1, 2, 4, 8):
            raise c.fail(f"rng-bit-generator cannot produce {t.value}")
    return None


@rule("rng-get-and-update-state")
def _rng_state(c: Ctx) -> Shape:
    c.count(0)
    return array_shape(U64, [2])
