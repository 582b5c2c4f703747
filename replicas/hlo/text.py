"""HLO module text: read what XLA and JAX print, and print in the same style.

    m = parse_hlo(text)        # -> replicas.hlo.ir.Module (ProgramError with line/column on bad text)
    text = print_module(m)     # parse_hlo(print_module(m)) == m

Syntax pieces live in their own modules: `lexer` (scanning), `parser` (the grammar),
`attributes` (each attribute's value syntax), `literals` (constants), `printer`.
"""

from __future__ import annotations

from replicas.errors import ProgramError
from replicas.hlo.ir import Module
from replicas.hlo.parser import ElidedPolicy, parse_module
from replicas.hlo.printer import print_module


def parse_hlo(text: str, *, verify: bool = True, elided: ElidedPolicy = "error") -> Module:
    """Parse HLO module text (`HloModule name, ...` followed by computations; without the
    `HloModule` line the `ENTRY` computation, else the last one, is the entry, as in XLA).

    With `verify` (the default) the module is also checked as a whole: shapes agree with shape
    inference, called computations exist, channel ordering holds (`replicas.hlo.verify`).
    `elided` says what a constant XLA printed as `{...}` becomes: "error" (the default) refuses
    it, "zeros" or "random" (fixed per instruction name) fill it, as XLA's parser does."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProgramError(f"HLO text is not UTF-8: {e}") from None
    if not isinstance(text, str):
        raise ProgramError(f"parse_hlo expects a str, got {type(text).__name__}")
    module = parse_module(text, elided=elided)
    if verify:
        from replicas.hlo.verify import verify as verify_module

        verify_module(module)
    return module


__all__ = ["parse_hlo", "print_module"]
