"""`replicas.hlo.ir.Module` -> HLO text in the style XLA prints (sigils, signatures, layouts).

The output parses back (`replicas.hlo.text.parse_hlo`) to an equal Module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replicas.errors import ProgramError
from replicas.hlo import attributes
from replicas.hlo.literals import format_literal

if TYPE_CHECKING:
    from replicas.hlo.ir import Computation, Instruction, Module

# Attributes printed in the operand position rather than after it.
_OPERAND_POSITION_ATTRS = frozenset({"literal", "parameter_number"})


def print_module(module: Module) -> str:
    header = "HloModule " + module.name
    for key, value in module.attrs.items():
        header += f", {key}={_header_value(value)}"
    parts = [header, ""]
    for comp in module.computations.values():
        parts.append(print_computation(comp, is_entry=comp.name == module.entry))
        parts.append("")
    return "\n".join(parts)


def _header_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def print_computation(comp: Computation, is_entry: bool = False) -> str:
    parameters = sorted((i for i in comp.instructions if i.opcode == "parameter"),
                        key=lambda i: i.attrs.get("parameter_number", 0))
    params = ", ".join(f"{p.name}: {p.shape.without_layout()}" for p in parameters)
    signature = ""
    root = next((i for i in comp.instructions if i.name == comp.root), None)
    if root is not None:
        signature = f" ({params}) -> {root.shape.without_layout()}"
    lines = [("ENTRY " if is_entry else "") + f"%{comp.name}{signature} {{"]
    for inst in comp.instructions:
        lines.append("  " + print_instruction(inst, is_root=inst.name == comp.root))
    lines.append("}")
    return "\n".join(lines)


def print_instruction(inst: Instruction, is_root: bool = False) -> str:
    if inst.opcode == "constant":
        if "literal" not in inst.attrs:
            raise inst.error("a constant without a literal cannot be printed")
        try:
            inside = format_literal(inst.attrs["literal"], inst.shape)
        except (TypeError, ValueError, OverflowError) as e:
            raise inst.error(f"the literal does not fit shape {inst.shape}: {e}") from None
    elif inst.opcode == "parameter":
        if "parameter_number" not in inst.attrs:
            raise inst.error("a parameter without a parameter_number cannot be printed")
        inside = str(int(inst.attrs["parameter_number"]))
    else:
        inside = ", ".join("%" + o for o in inst.operands)
    text = f"{'ROOT ' if is_root else ''}%{inst.name} = {inst.shape} {inst.opcode}({inside})"
    for key, value in inst.attrs.items():
        if key in _OPERAND_POSITION_ATTRS or value is None:
            continue
        spec = attributes.BY_IR_NAME.get(key)
        if spec is None:
            raise ProgramError(f"attribute {key!r} has no HLO text form", instruction=f"%{inst.name} ({inst.opcode})",
                               line=inst.line)
        try:
            text += f", {spec.text_name}={spec.format(value)}"
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise inst.error(f"attribute {key}={value!r} cannot be printed: {e}") from None
    return text
