"""Shape inference for every HLO opcode, with XLA's rules (xla/service/shape_inference.cc).

`infer_shape(opcode, operand_shapes, attrs, computations)` returns the result shape an instruction
must have, or None when the instruction itself gives it (parameter, constant, iota, reshape,
broadcast, convert, rng, custom-call, infeed, recv, ...). Pass the instruction's declared shape as
`result=` to also check those (reshape element count, iota dimension in range, ...), and the
number of participating devices as `num_replicas=` to check replica groups and infer collective
result shapes. Violations raise `ProgramError` naming the opcode and the rule.

The rules live in one module per op family, named as in `replicas/ops/` (`hlo/opcodes.py` gives each
opcode's family); importing the package registers them all.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.ir import Computation
from replicas.hlo.opcodes import OPCODES
from replicas.hlo.shape_inference.base import RULES, Ctx
from replicas.hlo.shape_inference.compare import comparison_type_for
from replicas.hlo.shape_inference.convolution import ConvDimensionNumbers, parse_dim_labels
from replicas.shapes import Shape

for _info in pkgutil.iter_modules(__path__):  # importing a family's module registers its rules
    if _info.name != "base":
        importlib.import_module(f"{__name__}.{_info.name}")


def infer_shape(opcode: str, operand_shapes: Sequence[Shape], attrs: dict[str, Any],
                computations: Callable[[str], Computation], *, result: Shape | None = None,
                num_replicas: int | None = None) -> Shape | None:
    """The result shape of `opcode` applied to operands of `operand_shapes` (layouts dropped), or None
    when only the instruction can say; raises ProgramError on a rule violation."""
    rule = RULES.get(opcode)
    if rule is None:
        raise ProgramError(f"{opcode}: unknown opcode")
    operands = [s.without_layout() for s in operand_shapes]
    declared = result.without_layout() if result is not None else None
    ctx = Ctx(opcode, operands, dict(attrs), computations, declared, num_replicas)
    arity = OPCODES[opcode].arity if opcode in OPCODES else None
    if arity is not None:
        ctx.count(arity)
    try:
        shape = rule(ctx)
    except ProgramError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as e:
        # A malformed attribute value (wrong type or arity) is a program error, not a crash.
        raise ProgramError(f"{opcode}: malformed attributes {attrs!r}: {type(e).__name__}: {e}") from None
    return shape.without_layout() if shape is not None else None


def known_opcodes() -> frozenset[str]:
    return frozenset(RULES)


__all__ = ["infer_shape", "known_opcodes", "parse_dim_labels", "ConvDimensionNumbers",
           "comparison_type_for"]
