"""Shape rule of dynamic-reshape (the result's dimension sizes are operands, known when it runs)."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import Ctx, rule
from replicas.hlo.shape_inference.shape_ops import same_type_result


@rule("dynamic-reshape")
def _dynamic_reshape(c: Ctx) -> None:
    same_type_result(c)
    return None
