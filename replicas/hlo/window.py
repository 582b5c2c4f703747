"""The Window attribute of convolution, reduce-window and select-and-scatter (docs/ir.md)."""

from __future__ import annotations

from typing import Any


def make_window(rank: int, size: list[int] | None = None, stride: list[int] | None = None,
                pad: list[tuple[int, int]] | None = None, lhs_dilate: list[int] | None = None,
                rhs_dilate: list[int] | None = None, window_reversal: list[bool] | None = None
                ) -> dict[str, Any]:
    """A Window attribute with every key present (see docs/ir.md)."""
    return {
        "size": list(size) if size is not None else [1] * rank,
        "stride": list(stride) if stride is not None else [1] * rank,
        "pad": [tuple(p) for p in pad] if pad is not None else [(0, 0)] * rank,
        "lhs_dilate": list(lhs_dilate) if lhs_dilate is not None else [1] * rank,
        "rhs_dilate": list(rhs_dilate) if rhs_dilate is not None else [1] * rank,
        "window_reversal": list(window_reversal) if window_reversal is not None else [False] * rank,
    }
