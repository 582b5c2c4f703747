"""Parameters and constants (the values a computation starts from)."""

from __future__ import annotations

from replicas.ops.registry import kernel


@kernel("constant")
def make_constant(inst, ctx):
    literal = inst.attrs["literal"]

    def constant():
        return literal

    return constant
