"""Shape rule of custom-call (the instruction declares its result)."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    Ctx,
    rule,
)


@rule("custom-call")
def _custom_call(c: Ctx) -> None:
    target = c.attr("custom_call_target")
    if not isinstance(target, str) or not target:
        raise c.fail(f"custom_call_target must be a non-empty string, got {target!r}")
    return None
