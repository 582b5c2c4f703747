"""`load` / `save` a module, choosing the format by the file's suffix.

`.msgpack`: the binary format of `replicas.hlo.serialize`. `.hlo` and `.txt`: HLO text (as
`Module.to_hlo_text()` prints and `parse_hlo` reads). Any other suffix raises ProgramError, as does a
path that cannot be read or written.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from replicas.errors import ProgramError, ResourceExhausted, exhausted_resource
from replicas.hlo.ir import Module

BINARY_SUFFIXES = (".msgpack",)
TEXT_SUFFIXES = (".hlo", ".txt")


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in BINARY_SUFFIXES:
        return "msgpack"
    if suffix in TEXT_SUFFIXES:
        return "text"
    known = ", ".join(BINARY_SUFFIXES + TEXT_SUFFIXES)
    raise ProgramError(f"{str(path)!r}: unknown file suffix {suffix or '(none)'!r}; expected one of {known}")


def _as_path(path: str | os.PathLike[str]) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ProgramError(f"expected a file path, got {type(path).__name__}")
    return Path(path)


def load(path: str | os.PathLike[str], *, elided: str = "error", verify: bool = True) -> Module:
    """The module stored at `path` (`.msgpack` binary, or `.hlo` / `.txt` HLO text); `elided` is
    `parse_hlo`'s choice for constants printed as `{...}`. With `verify` (the default) the module
    is checked as a whole, as `parse_hlo` checks text."""
    path = _as_path(path)
    kind = _format_of(path)
    try:
        data = _read_bounded(path)
    except FileNotFoundError:
        raise ProgramError(f"{str(path)!r}: no such file") from None
    except OSError as e:
        if exhausted_resource(e) == "file descriptors":
            raise ResourceExhausted(f"{str(path)!r}: cannot read: {e.strerror or e} (no file descriptor left)",
                                    "file descriptors") from None
        raise ProgramError(f"{str(path)!r}: cannot read: {e.strerror or e}") from None
    if kind == "msgpack":
        from replicas.hlo.serialize import module_from_bytes
        from replicas.hlo.verify import verify as verify_module
        from replicas.limits import check_module

        try:
            module = module_from_bytes(data)
            check_module(module)
            if verify:
                verify_module(module)
            return module
        except ProgramError as e:
            raise _naming_path(e, path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProgramError(f"{str(path)!r}: HLO text is not valid UTF-8 (byte {e.start})") from None
    from replicas.hlo.text import parse_hlo

    try:
        return parse_hlo(text, elided=elided, verify=verify)  # type: ignore[arg-type]
    except ProgramError as e:
        raise _naming_path(e, path) from None


def _read_bounded(path: Path) -> bytes:
    """The file's bytes; a special file (a pipe, /dev/zero) or one over the byte ceiling is refused
    before it is read."""
    from replicas.limits import check_program_size, current, format_bytes

    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise ProgramError(f"{str(path)!r}: cannot read: not a regular file")
    check_program_size(info.st_size, str(path))
    if info.st_size > current().max_bytes:
        raise ProgramError(f"{str(path)!r}: {format_bytes(info.st_size)} is more than the ceiling of "
                           f"{format_bytes(current().max_bytes)}")
    return path.read_bytes()


def _naming_path(error: ProgramError, path: Path) -> ProgramError:
    named = ProgramError(f"{str(path)!r}: {error}")
    named.instruction, named.line, named.column = error.instruction, error.line, error.column
    return named


def save(module: Module, path: str | os.PathLike[str]) -> None:
    """Write `module` to `path` in the format its suffix names. The file is replaced atomically, so a
    failed save never leaves half a file behind."""
    if not isinstance(module, Module):
        raise ProgramError(f"save: expected a Module, got {type(module).__name__}")
    path = _as_path(path)
    if _format_of(path) == "msgpack":
        from replicas.hlo.serialize import module_to_bytes

        data = module_to_bytes(module)
    else:
        data = module.to_hlo_text().encode("utf-8")
    directory = path.parent
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise ProgramError(f"{str(path)!r}: cannot write: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp makes the file private; give it the mode an ordinary write would (or the old file's).
        os.chmod(temporary, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(temporary, path)
    except OSError as e:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise ProgramError(f"{str(path)!r}: cannot write: {e.strerror or e}") from None


__all__ = ["load", "save"]
