"""A position-based scanner over HLO text: whitespace and comments, names, numbers, strings and
raw attribute values, with line/column positions for error messages.

Every pattern here is anchored at the current position and made of single-pass pieces (character
classes, non-overlapping alternatives), so scanning is linear in the length of the text. Every
repetition of a group is possessive (`*+`, `++`): Python's `re` otherwise keeps a backtracking
record per iteration, ~120 bytes per character of a long comment or string.
"""

from __future__ import annotations

import bisect
import re

from replicas.errors import ProgramError

# Whitespace, /* block */ and // line comments (XLA prints /*index=5*/ inside long lists).
_SKIP = re.compile(r"(?:[ \t\r\n]++|/\*(?:[^*]++|\*(?!/))*+\*/|//[^\n]*+)*+")
_NOT_SKIPPABLE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789%_{}()[],=:\"-.")
_SKIP_INLINE = re.compile(r"(?:[ \t\r]++|/\*(?:[^*\n]++|\*(?!/))*+\*/)*+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_INT = re.compile(r"-?[0-9]+")
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.S)  # XLA's strings may span lines (a module inside an attribute)
# Characters a raw attribute value may run over without any bookkeeping.
_RAW_PLAIN = re.compile(r'[^,{}\[\]()"\n]*')
_RAW_PLAIN_NESTED = re.compile(r'[^{}\[\]()"]*')
_NEEDS_ESCAPE = re.compile(r'[^\x20-\x7e]|["\'\\]')
_CLOSERS = {"{": "}", "[": "]", "(": ")"}

_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\", "?": "?",
                   "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


class Scanner:
    """The text, a current position, and the primitives the HLO parser is built from."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self._newlines: list[int] | None = None
        self._last_line = (0, 1)  # (a position, its line): where `line_of` counts on from

    # -- positions and errors --------------------------------------------------------------------
    def line_col(self, pos: int) -> tuple[int, int]:
        if self._newlines is None:
            self._newlines = [m.start() for m in re.finditer("\n", self.text)]
        line = bisect.bisect_left(self._newlines, pos)
        start = self._newlines[line - 1] + 1 if line > 0 else 0
        return line + 1, pos - start + 1

    def line_of(self, pos: int) -> int:
        # The parser asks in text order: count the newlines since the last answer rather than index
        # them all (a list of every newline's offset costs ~40 bytes a line, more than a dense line).
        last_pos, last_line = self._last_line
        if pos < last_pos:
            return self.line_col(pos)[0]
        line = last_line + self.text.count("\n", last_pos, pos)
        self._last_line = (pos, line)
        return line

    def error(self, message: str, pos: int | None = None) -> ProgramError:
        pos = self.pos if pos is None else min(pos, len(self.text))
        line, col = self.line_col(pos)
        end = self.text.find("\n", pos)
        snippet = self.text[pos:end if end >= 0 else len(self.text)][:60]
        where = f" at {snippet!r}" if snippet else " at end of text"
        return ProgramError(message + where, line=line, column=col)

    # -- primitives ------------------------------------------------------------------------------
    def skip(self) -> None:
        if self.text[self.pos:self.pos + 1] in _NOT_SKIPPABLE:
            return
        self.pos = _SKIP.match(self.text, self.pos).end()

    def skip_inline(self) -> None:
        """Spaces and /* */ comments, but not a line break."""
        self.pos = _SKIP_INLINE.match(self.text, self.pos).end()

    def at_end(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)

    def peek(self) -> str:
        """The next significant character ('' at the end)."""
        self.skip()
        return self.text[self.pos:self.pos + 1]

    def startswith(self, s: str) -> bool:
        self.skip()
        return self.text.startswith(s, self.pos)

    def accept(self, s: str) -> bool:
        if self.startswith(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str, what: str | None = None) -> None:
        if not self.accept(s):
            raise self.error(f"expected {what or repr(s)}")

    def name(self, what: str = "a name", sigil: bool = True) -> str:
        """An identifier, with an optional leading '%' (dropped)."""
        self.skip()
        start = self.pos
        if sigil and self.text.startswith("%", start):
            start += 1
        m = _NAME.match(self.text, start)
        if not m:
            raise self.error(f"expected {what}")
        self.pos = m.end()
        return m.group(0)

    def try_name(self) -> str | None:
        self.skip()
        m = _NAME.match(self.text, self.pos)
        return m.group(0) if m else None

    def integer(self, what: str = "an integer") -> int:
        self.skip()
        m = _INT.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected {what}")
        self.pos = m.end()
        return int(m.group(0))

    def string(self) -> str:
        self.skip()
        m = _STRING.match(self.text, self.pos)
        if not m:
            raise self.error("expected a quoted string")
        self.pos = m.end()
        return unescape(m.group(0)[1:-1])

    def balanced(self) -> str:
        """A bracketed span starting here ('{...}', '[...]' or '(...)'), strings skipped; returned whole."""
        self.skip()
        start = self.pos
        self._skip_balanced()
        return self.text[start:self.pos]

    def _skip_balanced(self) -> None:
        text = self.text
        stack = [_CLOSERS[text[self.pos]]]
        start = self.pos
        pos = self.pos + 1
        n = len(text)
        while stack:
            pos = _RAW_PLAIN_NESTED.match(text, pos).end()
            if pos >= n:
                raise self.error(f"unclosed {text[start]!r}", start)
            c = text[pos]
            if c == '"':
                m = _STRING.match(text, pos)
                if not m:
                    raise self.error("unterminated string", pos)
                pos = m.end()
            elif c in _CLOSERS:
                stack.append(_CLOSERS[c])
                pos += 1
            elif c in "}])":
                if c != stack.pop():
                    raise self.error(f"mismatched {c!r}", pos)
                pos += 1
            else:
                raise self.error(f"unexpected {c!r}", pos)
        self.pos = pos

    def raw_value(self) -> str:
        """The raw text of an attribute value: up to the next ',' or newline at bracket depth 0
        (or an unmatched closing bracket, or the end)."""
        self.skip()
        text = self.text
        n = len(text)
        start = pos = self.pos
        while True:
            pos = _RAW_PLAIN.match(text, pos).end()
            if pos >= n:
                break
            c = text[pos]
            if c in _CLOSERS:
                self.pos = pos
                self._skip_balanced()
                pos = self.pos
            elif c == '"':
                m = _STRING.match(text, pos)
                if not m:
                    raise self.error("unterminated string", pos)
                pos = m.end()
            else:  # ',', '\n' or an unmatched closer
                break
        self.pos = pos
        return text[start:pos].rstrip()


def unescape(body: str) -> str:
    """Undo C escaping (XLA prints strings with absl::CEscape): \\n, \\", \\\\, octal, hex."""
    if "\\" not in body:
        return body
    out = bytearray()
    i = 0
    n = len(body)
    while i < n:
        c = body[i]
        if c != "\\":
            j = body.find("\\", i)
            j = n if j < 0 else j
            out += body[i:j].encode("utf-8")
            i = j
            continue
        if i + 1 >= n:
            raise ValueError("string ends in a lone backslash")
        e = body[i + 1]
        if e in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[e].encode()
            i += 2
        elif e in "01234567":
            j = i + 1
            while j < n and j < i + 4 and body[j] in "01234567":
                j += 1
            out.append(int(body[i + 1:j], 8) & 0xFF)
            i = j
        elif e == "x":
            j = i + 2
            while j < n and body[j] in "0123456789abcdefABCDEF":
                j += 1
            if j == i + 2:
                raise ValueError("\\x without hex digits")
            out.append(int(body[i + 2:j], 16) & 0xFF)
            i = j
        else:
            raise ValueError(f"unknown escape \\{e}")
    return out.decode("utf-8", errors="surrogateescape")


def escape(s: str) -> str:
    """C-escape a string the way absl::CEscape does, without the quotes."""
    if not _NEEDS_ESCAPE.search(s):
        return s
    out = []
    for b in s.encode("utf-8", errors="surrogateescape"):
        if b == 0x0A:
            out.append("\\n")
        elif b == 0x0D:
            out.append("\\r")
        elif b == 0x09:
            out.append("\\t")
        elif b == 0x22:
            out.append('\\"')
        elif b == 0x27:
            out.append("\\'")
        elif b == 0x5C:
            out.append("\\\\")
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\{b:03o}")
    return "".join(out)


def quote(s: str) -> str:
    return '"' + escape(s) + '"'
