"""The program IR: Module > Computation > Instruction. Plain data; no kernels, no numpy maths.

Opcodes are spelled as in HLO text (`add`, `all-reduce`, `get-tuple-element`). Attribute names
and value types are the contract between the builder, the HLO text parser/printer, msgpack,
the verifier and the kernels; docs/ir.md lists them. Operands are instruction names within the
same computation; called computations are named by attributes (`to_apply`, `body`, ...).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.attributes import COMPUTATION_ATTRS  # the attributes naming called computations
from replicas.hlo.window import make_window  # noqa: F401  (part of the IR's public face)
from replicas.shapes import Shape


class _NoAttributes(dict):
    """The attributes of an instruction that has none, when read from text or msgpack: one shared
    empty dict, read-only (a dense program has an instruction per ~40 bytes of text, and an empty dict
    of its own each costs more than half of that). Copies are plain dicts."""

    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("an instruction's shared empty attributes are read-only: give it a dict of its own")

    __setitem__ = __delitem__ = __ior__ = setdefault = update = pop = popitem = clear = _read_only

    def copy(self) -> dict[str, Any]:
        return {}

    def __reduce__(self) -> tuple[type, tuple]:
        return dict, ()


NO_ATTRS: dict[str, Any] = _NoAttributes()


# Slots: a dense program holds one Instruction per ~40 bytes of its text, and an instance dict
# would cost more than the text it came from (parsing is bounded at 10x its input).
@dataclass(eq=False, slots=True)
class Instruction:
    name: str
    opcode: str
    shape: Shape
    operands: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    line: int | None = None  # source line in HLO text, for error messages
    # The raw `metadata={...}` text (op_name, source file and line): read by `hlo.source` for
    # reports only, never part of what the instruction computes (not compared, not printed).
    metadata: str | None = None

    def called_computations(self) -> list[str]:
        names: list[str] = []
        for key in COMPUTATION_ATTRS:
            value = self.attrs.get(key)
            if value is None:
                continue
            if isinstance(value, str):
                names.append(value)
            else:
                names.extend(value)
        return names

    def error(self, message: str) -> ProgramError:
        return ProgramError(message, instruction=f"%{self.name} ({self.opcode})", line=self.line)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Instruction):
            return NotImplemented
        return (self.name == other.name and self.opcode == other.opcode and self.shape == other.shape
                and self.operands == other.operands and _attrs_equal(self.attrs, other.attrs))

    def __repr__(self) -> str:
        return f"Instruction(%{self.name} = {self.shape} {self.opcode}({', '.join(self.operands)}))"


@dataclass(eq=False)
class Computation:
    name: str
    instructions: list[Instruction] = field(default_factory=list)
    root: str = ""
    is_fusion: bool = False

    def __post_init__(self) -> None:
        self._by_name: dict[str, Instruction] | None = None

    def add(self, inst: Instruction) -> Instruction:
        by_name = self.by_name
        if inst.name in by_name:
            raise ProgramError(f"instruction %{inst.name} defined twice in computation {self.name}",
                               line=inst.line)
        self.instructions.append(inst)
        by_name[inst.name] = inst
        return inst

    @property
    def by_name(self) -> dict[str, Instruction]:
        if self._by_name is None or len(self._by_name) != len(self.instructions):
            self._by_name = {i.name: i for i in self.instructions}
        return self._by_name

    def instruction(self, name: str) -> Instruction:
        try:
            return self.by_name[name]
        except KeyError:
            raise ProgramError(f"computation {self.name} has no instruction %{name}") from None

    @property
    def parameters(self) -> list[Instruction]:
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return sorted(params, key=lambda i: i.attrs["parameter_number"])

    @property
    def parameter_shapes(self) -> list[Shape]:
        return [p.shape for p in self.parameters]

    @property
    def root_instruction(self) -> Instruction:
        if not self.root:
            raise ProgramError(f"computation {self.name} has no root")
        return self.instruction(self.root)

    @property
    def result_shape(self) -> Shape:
        return self.root_instruction.shape

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Computation):
            return NotImplemented
        return (self.name == other.name and self.root == other.root
                and self.instructions == other.instructions)

    def __repr__(self) -> str:
        return f"Computation({self.name}, {len(self.instructions)} instructions, root %{self.root})"


@dataclass(eq=False)
class Module:
    name: str
    computations: dict[str, Computation] = field(default_factory=dict)
    entry: str = ""
    # HloModule header attributes: replica_count, num_partitions, entry_computation_layout, ...
    attrs: dict[str, Any] = field(default_factory=dict)
    # The FileNames/FunctionNames/FileLocations/StackFrames tables of newer HLO text, raw: id -> text
    # per table; `metadata={stack_frame_id=N}` points into them (see `hlo.source`). Not compared.
    stack_frames: dict[str, dict[int, str]] = field(default_factory=dict)

    def add(self, comp: Computation) -> Computation:
        if comp.name in self.computations:
            raise ProgramError(f"computation {comp.name} defined twice")
        self.computations[comp.name] = comp
        return comp

    def computation(self, name: str) -> Computation:
        try:
            return self.computations[name]
        except KeyError:
            raise ProgramError(f"module {self.name} has no computation {name!r}") from None

    @property
    def entry_computation(self) -> Computation:
        return self.computation(self.entry)

    @property
    def replica_count(self) -> int | None:
        return self.attrs.get("replica_count")

    @property
    def num_partitions(self) -> int:
        return int(self.attrs.get("num_partitions", 1))

    def instructions(self) -> Iterator[tuple[Computation, Instruction]]:
        for comp in self.computations.values():
            for inst in comp.instructions:
                yield comp, inst

    def to_hlo_text(self) -> str:
        from replicas.hlo.printer import print_module  # the printer reads the IR without importing it

        return print_module(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Module):
            return NotImplemented
        return (self.name == other.name and self.entry == other.entry
                and _attrs_equal(self.attrs, other.attrs)
                and list(self.computations) == list(other.computations)
                and all(a == b for a, b in zip(self.computations.values(), other.computations.values())))

    def __repr__(self) -> str:
        return f"Module({self.name}, entry={self.entry}, {len(self.computations)} computations)"


def _attrs_equal(a: Any, b: Any) -> bool:
    """Structural equality that also compares numpy literals exactly (bits, dtype, shape)."""
    import numpy as np

    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_attrs_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(_attrs_equal(x, y) for x, y in zip(a, b)))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)  # nan attributes (a constant's fill value) equal themselves
    return a == b
