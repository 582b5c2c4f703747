"""fft: FFT / IFFT / RFFT / IRFFT over the innermost len(fft_length) axes (numpy's pocketfft).

numpy computes f32 inputs in single precision (numpy >= 2) and f64 in double; the result is cast
to the result type the instruction declares (c64/c128 for FFT, IFFT, RFFT; f32/f64 for IRFFT).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, kernel

_TRANSFORMS = {"FFT": np.fft.fftn, "IFFT": np.fft.ifftn, "RFFT": np.fft.rfftn, "IRFFT": np.fft.irfftn}


@kernel("fft")
def make_fft(inst: Instruction, ctx: KernelContext) -> Callable[[np.ndarray], np.ndarray]:
    (operand_shape,) = ctx.operand_shapes(inst)
    fft_type = str(inst.attrs.get("fft_type", "")).upper()
    if fft_type not in _TRANSFORMS:
        raise inst.error(f"fft_type must be one of {sorted(_TRANSFORMS)}, got {inst.attrs.get('fft_type')!r}")
    lengths = [int(n) for n in inst.attrs.get("fft_length", [])]
    rank = operand_shape.rank
    if not 1 <= len(lengths) <= 3 or len(lengths) > rank:
        raise inst.error(f"fft_length {lengths} must name 1 to 3 of the operand's {rank} dimensions")
    inner = list(operand_shape.dimensions[rank - len(lengths):])
    if fft_type == "IRFFT":
        expected = lengths[:-1] + [lengths[-1] // 2 + 1]
    else:
        expected = lengths
    if inner != expected:
        raise inst.error(f"{fft_type} with fft_length {lengths} needs innermost dimensions {expected}, "
                         f"the operand has {inner}")
    out_dtype = inst.shape.dtype
    complex_in = fft_type != "RFFT"
    if complex_in != (operand_shape.dtype.kind == "c"):
        raise inst.error(f"{fft_type} takes a {'complex' if complex_in else 'real'} operand, got {operand_shape}")
    axes = tuple(range(rank - len(lengths), rank))
    transform = _TRANSFORMS[fft_type]
    out_dims = tuple(inst.shape.dimensions)
    empty = int(np.prod(out_dims, dtype=np.int64)) == 0 or 0 in lengths

    def fft(operand: np.ndarray) -> np.ndarray:
        if empty:
            return np.zeros(out_dims, dtype=out_dtype)
        if fft_type == "RFFT":
            # The innermost input dims equal fft_length already; `s` just pins irfft's output length.
            result = transform(operand, axes=axes)
        else:
            result = transform(operand, s=lengths, axes=axes)
        return np.ascontiguousarray(result, dtype=out_dtype)

    return fft
