"""XlaBuilder custom-call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.hlo.builder.core import BuilderCore, XlaOp
from replicas.shapes import Shape


class CustomCallOps(BuilderCore):
    # -- custom call -----------------------------------------------------------------------------------
    def custom_call(self, call_target_name: str, operands: Sequence[XlaOp], shape: Shape | str,
                    opaque: str = "", has_side_effect: bool = False,
                    called_computations: Sequence[Any] | None = None) -> XlaOp:
        """A custom-call; `has_side_effect` is accepted for XLA compatibility, but every custom-call
        already keeps its program order here (opcodes.SIDE_EFFECT_OPCODES)."""
        if isinstance(shape, str):
            shape = Shape.parse(shape)
        attrs: dict[str, Any] = {"custom_call_target": call_target_name}
        if opaque:
            attrs["backend_config"] = opaque
        if called_computations:
            attrs["called_computations"] = [self._import(c) for c in called_computations]
        return self._emit("custom-call", [self._op(o) for o in operands], attrs, shape=shape)
