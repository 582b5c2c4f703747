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
    fft_type = str(inst.attrs["fft_type"]).upper()
    lengths = [int(n) for n in inst.attrs["fft_length"]]
    rank = operand_shape.rank
    out_dtype = inst.shape.dtype
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
