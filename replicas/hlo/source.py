"""Where an instruction came from in the user's program: JAX's (and XLA's) `metadata={...}`.

The parser keeps each instruction's metadata as its raw text (`Instruction.metadata`) and the
module's stack-frame tables (`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`) as
theirs (`Module.stack_frames`); nothing is decoded until a report asks (`SourceMap`), so a run
that reports nothing pays nothing. Older JAX writes `source_file=` and `source_line=` in the
metadata itself; newer writes a `stack_frame_id=` into the module's tables.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replicas.hlo.ir import Instruction, Module

_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,}]+)')


@dataclass(frozen=True)
class Source:
    """`psum at train.py:42 in step (jit(step)/shard_map/psum)`: the op, its file and line, the
    Python function, and JAX's op name (its path through the transformations)."""

    op_name: str | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None

    @property
    def op(self) -> str | None:
        return self.op_name.rstrip("/").rsplit("/", 1)[-1] if self.op_name else None

    @property
    def location(self) -> str | None:
        """`train.py:42` (the file's base name)."""
        if not self.file:
            return None
        return os.path.basename(self.file) + (f":{self.line}" if self.line is not None else "")

    def __str__(self) -> str:
        location = self.location
        if location is None:
            return self.op_name or ""
        text = (f"{self.op} at " if self.op else "") + location
        if self.function and self.function != "<module>":
            text += f" in {self.function}"
        if self.op_name and self.op_name != self.op:
            text += f" ({self.op_name})"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"op_name": self.op_name, "file": self.file, "line": self.line, "function": self.function}


def metadata_fields(raw: str) -> dict[str, str]:
    """`{op_name="a/b" source_line=3}` -> {"op_name": "a/b", "source_line": "3"} (strings unquoted)."""
    out = {}
    for key, value in _PAIR.findall(raw):
        if value.startswith('"'):
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        out[key] = value
    return out


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class SourceMap:
    """Instruction -> `Source`, for one module; decoded on first use, then cached."""

    def __init__(self, module: Module | None) -> None:
        self._module = module
        self._by_name: dict[str, list[tuple[str, Instruction]]] | None = None
        self._cache: dict[tuple[str | None, str], Source | None] = {}
        self._frames: dict[str, dict[int, str]] = getattr(module, "stack_frames", None) or {}

    def __bool__(self) -> bool:
        return self._module is not None

    def lookup(self, name: str | None, computation: str | None = None) -> Source | None:
        """The source of instruction `%name` (of `computation`, when names repeat across computations)."""
        if self._module is None or not name:
            return None
        key = (computation, name)
        if key in self._cache:
            return self._cache[key]
        if self._by_name is None:
            self._by_name = {}
            for comp, inst in self._module.instructions():
                if getattr(inst, "metadata", None):
                    self._by_name.setdefault(inst.name, []).append((comp.name, inst))
        found = self._by_name.get(name, [])
        if computation is not None and len(found) > 1:
            found = [f for f in found if f[0] == computation] or found
        source = self.source_of(found[0][1]) if found else None
        self._cache[key] = source
        return source

    def text(self, name: str | None, computation: str | None = None) -> str | None:
        source = self.lookup(name, computation)
        text = str(source) if source is not None else ""
        return text or None

    def source_of(self, inst: Instruction) -> Source | None:
        raw = getattr(inst, "metadata", None)
        if not raw:
            return None
        fields = metadata_fields(raw)
        file, line, function = fields.get("source_file"), _int(fields.get("source_line")), None
        frame = _int(fields.get("stack_frame_id"))
        if frame is not None:
            file, line, function = self._frame(frame) or (file, line, function)
        op_name = fields.get("op_name") or None
        if op_name is None and file is None:
            return None
        return Source(op_name, file, line, function)

    def _frame(self, frame_id: int) -> tuple[str | None, int | None, str | None] | None:
        """(file, line, function) of the innermost frame `frame_id` names, from the module's tables."""
        frame = self._frames.get("StackFrames", {}).get(frame_id)
        if frame is None:
            return None
        location = self._frames.get("FileLocations", {}).get(_int(metadata_fields(frame).get("file_location_id")) or -1)
        if location is None:
            return None
        loc = metadata_fields(location)
        file = self._frames.get("FileNames", {}).get(_int(loc.get("file_name_id")) or -1)
        function = self._frames.get("FunctionNames", {}).get(_int(loc.get("function_name_id")) or -1)
        return (_unquote(file), _int(loc.get("line")), _unquote(function))


def _unquote(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return text[1:-1].replace('\\"', '"').replace("\\\\", "\\") if text.startswith('"') else text


NO_SOURCES = SourceMap(None)
