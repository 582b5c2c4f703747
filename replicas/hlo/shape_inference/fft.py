"""Shape rule of fft."""

from __future__ import annotations

from replicas.hlo.shape_inference.base import (
    Ctx,
    array_shape,
    rule,
)
from replicas.shapes import PrimitiveType, Shape

_REAL_OF = {PrimitiveType.C64: PrimitiveType.F32, PrimitiveType.C128: PrimitiveType.F64}


_COMPLEX_OF = {v: k for k, v in _REAL_OF.items()}


@rule("fft")
def _fft(c: Ctx) -> Shape:
    s = c.array(0)
    kind = c.attr("fft_type")
    lengths = c.int_list("fft_length")
    if not 1 <= len(lengths) <= 3:
        raise c.fail(f"fft_length {lengths} must have 1 to 3 entries")
    if s.rank < len(lengths):
        raise c.fail(f"operand {s} has fewer dimensions than fft_length {lengths}")
    tail = list(s.dimensions[s.rank - len(lengths):])
    t = s.element_type
    if kind in ("FFT", "IFFT"):
        if not t.is_complex:
            raise c.fail(f"{kind} expects a complex operand, got {s}")
        if tail != lengths:
            raise c.fail(f"{kind}: the operand's trailing dimensions {tail} must equal fft_length {lengths}")
        return s
    if kind == "RFFT":
        if t not in _COMPLEX_OF:
            raise c.fail(f"RFFT expects an f32 or f64 operand, got {s}")
        if tail != lengths:
            raise c.fail(f"RFFT: the operand's trailing dimensions {tail} must equal fft_length {lengths}")
        out = list(s.dimensions)
        if lengths[-1]:
            out[-1] = lengths[-1] // 2 + 1
        return array_shape(_COMPLEX_OF[t], out)
    if kind == "IRFFT":
        if not t.is_complex:
            raise c.fail(f"IRFFT expects a complex operand, got {s}")
        want = lengths[:-1] + [lengths[-1] // 2 + 1 if lengths[-1] else 0]
        if tail != want:
            raise c.fail(f"IRFFT: the operand's trailing dimensions {tail} must be {want} for fft_length {lengths}")
        out = list(s.dimensions)
        out[-1] = lengths[-1]
        return array_shape(_REAL_OF[t], out)
    raise c.fail(f"fft_type must be FFT, IFFT, RFFT or IRFFT, got {kind!r}")
