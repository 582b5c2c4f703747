"""Shape rule of dynamic-reshape (the result's dimension sizes are operands, known when it runs)."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import Ctx, rule
from replicas.hlo.shape_inference.shape_ops import same_type_result


@rule("dynamic-reshape")
def _dynamic_reshape(c: Ctx) -> None:
    same_type_result(c)
    r = c.result
    if r is not None and len(c.operands) != 1 + r.rank:
        raise c.fail(f"dynamic-reshape to {r} takes the operand and {r.rank} sizes, got {len(c.operands) - 1} sizes")
    for s in c.operands[1:]:
        if not (s.is_array and s.is_scalar and s.element_type.is_integral):
            raise c.fail(f"dynamic-reshape sizes must be integer scalars, got {s}")
    return None
