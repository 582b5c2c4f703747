"""Collective fingerprints: what the members of a group must agree on, and the diff when they don't.

A fingerprint is a compact tuple of plain values (strings, ints, tuples), one per field of
`FIELDS`, computed once when the kernel is bound; it travels with the first message of every
collective, and the receiver compares it with its own. Equal tuples are the fast path; on a
difference `diff` names each differing field so the error reads like a diff.

The reduction computation is described by its structure (opcodes, shapes, operand wiring,
attributes; `add(f32)` for a plain binary reducer), never by its name: two `add` computations named
differently are the same reduction.
The instruction's identity (computation and instruction name) and its channel id are compared only
when the fabric is strict; the lenient mode pairs two different collectives of the same form, as
XLA on CPU does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replicas.caching import Cache
from replicas.collectives.groups import intern
from replicas.collectives.mismatch import mismatch_report, value_text
from replicas.errors import CollectiveMismatchError
from replicas.hlo.ir import COMPUTATION_ATTRS, Computation, Instruction, Module
from replicas.ops.recognize import binary_reducer

FIELDS = ("kind", "dtypes", "shapes", "replica_groups", "reduction", "dimensions", "source_target_pairs",
          "channel_id", "instruction")
IDENTITY_FIELDS = frozenset({"channel_id", "instruction"})
_IDENTITY_INDEXES = tuple(i for i, f in enumerate(FIELDS) if f in IDENTITY_FIELDS)
_FORM_INDEXES = tuple(i for i, f in enumerate(FIELDS) if f not in IDENTITY_FIELDS)
_KIND, _DTYPES, _SHAPES = 0, 1, 2
_INSTRUCTION = FIELDS.index("instruction")


@dataclass(frozen=True)
class Fingerprint:
    """A collective's fingerprint: `wire` travels, `as_dict()` is its JSON-able form."""

    wire: tuple

    @property
    def kind(self) -> str:
        return self.wire[_KIND]

    @property
    def computation(self) -> str:
        return self.wire[_INSTRUCTION][0]

    @property
    def name(self) -> str:
        return self.wire[_INSTRUCTION][1]

    @property
    def opcode(self) -> str:
        return self.wire[_INSTRUCTION][2]

    def as_dict(self) -> dict[str, Any]:
        """The JSON-able form; one shared (read-only by convention) dict per interned wire."""
        wire = self.wire
        return _dicts.get_or_make(wire, lambda: {field: _jsonable(v) for field, v in zip(FIELDS, wire)})

    def describe(self) -> str:
        """`%ar.2 (all-reduce f32[4])`."""
        operands = _operand_text(self.wire)
        return f"%{self.name} ({self.opcode} {operands})"


_dicts: Cache[dict[str, Any]] = Cache("fingerprint dicts", 4096, by_identity=True)


def _operand_text(wire: tuple) -> str:
    dtypes, shapes = wire[_DTYPES], wire[_SHAPES]
    texts = [f"{t}[{','.join(map(str, dims))}]" for t, dims in zip(dtypes, shapes)]
    return texts[0] if len(texts) == 1 else "(" + ", ".join(texts) + ")"


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def make_fingerprint(inst: Instruction, computation: str, operand_shapes: list[Any], module: Module | None, *,
                     groups: tuple = (), pairs: tuple = ()) -> Fingerprint:
    opcode = inst.opcode
    kind = opcode.removesuffix("-start")
    leaves = [leaf for s in operand_shapes for leaf in s.leaves()]
    dtypes = tuple(leaf.element_type.value for leaf in leaves)
    shapes = tuple(tuple(leaf.dimensions) for leaf in leaves)
    reduction = None
    to_apply = inst.attrs.get("to_apply")
    if to_apply is not None and module is not None:
        reduction = describe_computation(module, to_apply)
    dims = inst.attrs.get("dimensions")
    dimensions = tuple(int(d) for d in dims) if dims is not None else None
    channel = inst.attrs.get("channel_id")
    wire = (kind, dtypes, shapes, tuple(groups), reduction, dimensions, tuple(pairs),
            None if channel is None else int(channel), (computation, inst.name, opcode))
    # Every member of a process shares one wire: in-process messages then compare by identity.
    return Fingerprint(intern(wire))


def describe_computation(module: Module, name: str) -> str:
    """A canonical text of computation `name`: independent of its and its instructions' names."""
    comp = module.computation(name)
    op = binary_reducer(comp)
    if op is not None:
        return f"{op}({comp.parameters[0].shape.element_type.value})"
    return _describe(module, comp, set())


def _describe(module: Module, comp: Computation, active: set[str]) -> str:
    if comp.name in active:
        return "<recursive>"
    active = active | {comp.name}
    by_name = comp.by_name
    live: set[str] = set()
    stack = [comp.root]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(by_name[n].operands if n in by_name else ())
    ids: dict[str, str] = {}
    parts = []
    for inst in comp.instructions:
        if inst.name not in live:
            continue
        if inst.opcode == "parameter":
            ids[inst.name] = f"p{inst.attrs.get('parameter_number')}"
            parts.append(f"{ids[inst.name]}: {inst.shape.without_layout()}")
            continue
        ids[inst.name] = f"v{len(ids)}"
        operands = ", ".join(ids.get(o, "?") for o in inst.operands)
        attrs = _attrs_text(module, inst, active)
        parts.append(f"{ids[inst.name]} = {inst.shape.without_layout()} {inst.opcode}({operands}){attrs}")
    return "; ".join(parts) + f" -> {ids.get(comp.root, '?')}"


def _attrs_text(module: Module, inst: Instruction, active: set[str]) -> str:
    items = []
    for key in sorted(inst.attrs):
        if key in ("metadata", "frontend_attributes"):
            continue
        value = inst.attrs[key]
        if key in COMPUTATION_ATTRS:
            names = [value] if isinstance(value, str) else list(value)
            value = [("{" + _describe(module, module.computation(n), active) + "}") for n in names]
        elif hasattr(value, "tobytes") and hasattr(value, "dtype"):
            value = f"{value.dtype}{list(value.shape)}:{value.tobytes().hex()}"
        items.append(f"{key}={value}")
    return (", " + ", ".join(items)) if items else ""


def diff(expected: Fingerprint | tuple, found: Fingerprint | tuple, *, strict: bool = True
         ) -> list[tuple[str, Any, Any]]:
    """The fields where `found` differs from `expected`: [(field, expected value, found value)]."""
    a = _tupled(expected.wire if isinstance(expected, Fingerprint) else expected)
    b = _tupled(found.wire if isinstance(found, Fingerprint) else found)
    if a == b:
        return []
    if len(a) != len(b):
        return [("fingerprint", a, b)]
    out = []
    for i in _FORM_INDEXES + (_IDENTITY_INDEXES if strict else ()):
        if a[i] != b[i]:
            out.append((FIELDS[i], a[i], b[i]))
    return out


def _tupled(value: Any) -> Any:
    """Lists back to tuples: a transport that serializes tuples as lists must not cause a mismatch."""
    if isinstance(value, (list, tuple)):
        return tuple(_tupled(v) for v in value)
    return value


def mismatch_error(seq: int, me: int, own: Fingerprint, peer: int, theirs: tuple,
                   differences: list[tuple[str, Any, Any]]) -> CollectiveMismatchError:
    """The error a replica raises when peer's k-th collective is not its own k-th collective."""
    other = Fingerprint(theirs)
    try:
        other_text = other.describe()
    except (IndexError, TypeError, ValueError):
        other_text = repr(theirs)
    # The instructions are named anyway; a different kind makes the other fields noise (see the report).
    shown = [d for d in differences if d[0] == "kind"] or [d for d in differences if d[0] != "instruction"]
    details = "; ".join(f"{field}: {value_text(field, e)} != {value_text(field, f)}"
                        for field, e, f in shown or differences)
    message = (f"collective #{seq}: replica {me} is in {own.describe()} but replica {peer} is in "
               f"{other_text}: {details}")
    report = mismatch_report(seq, me, {"computation": own.computation, "name": own.name, "opcode": own.opcode},
                             peer, _identity_dict(other), differences, own.as_dict(), _safe_dict(other))
    return CollectiveMismatchError(message, report)


def _identity_dict(fp: Fingerprint) -> dict[str, Any]:
    try:
        return {"computation": fp.computation, "name": fp.name, "opcode": fp.opcode}
    except (IndexError, TypeError, ValueError):
        return {"computation": None, "name": None, "opcode": None}


def _safe_dict(fp: Fingerprint) -> dict[str, Any]:
    try:
        return fp.as_dict()
    except (IndexError, TypeError, ValueError):
        return {"raw": repr(fp.wire)}
