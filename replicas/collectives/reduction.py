"""Reductions in a fixed order, and the views collectives cut their operands and results into
(shared by the collective algorithm units)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Values = tuple[np.ndarray, ...]
Combine = Callable[[Values, Values], Values]


def reduce_in_order(parts: Sequence[Values], combine: Combine) -> Values:
    """parts[0] + parts[1] + ... in this order. The first sum is a fresh buffer; a fast-path
    reduction then accumulates into it in place."""
    acc = parts[0]
    if len(parts) == 1:
        return acc
    acc = combine(acc, parts[1])
    accumulate = getattr(combine, "accumulate", None)
    for p in parts[2:]:
        if accumulate is not None and all(isinstance(x, np.ndarray) and x.ndim for x in acc):
            accumulate(acc, p)
        else:
            acc = combine(acc, p)
    return acc


def reduce_into(out: Values, parts: Sequence[Values], combine: Combine) -> Values:
    """`reduce_in_order(parts, combine)` written into `out` (arrays of the parts' shapes and dtypes),
    the same operations in the same order: bitwise the same result, without a fresh buffer."""
    into = getattr(combine, "into", None)
    if into is None or len(parts) == 1:
        for o, v in zip(out, reduce_in_order(parts, combine)):
            np.copyto(o, v)
        return out
    ufunc = getattr(combine, "ufunc", None)
    if ufunc is not None:  # one operand (the usual all-reduce): the ufunc itself, no call per part around it
        o = out[0]
        ufunc(parts[0][0], parts[1][0], out=o)
        for p in parts[2:]:
            ufunc(o, p[0], out=o)
        return out
    into(out, parts[0], parts[1])
    for p in parts[2:]:
        combine.accumulate(out, p)  # type: ignore[attr-defined]
    return out


def nbytes(values: Values) -> int:
    return sum(v.nbytes for v in values)


def slot(dim: int, start: int, stop: int) -> tuple[slice, ...]:
    return (slice(None),) * dim + (slice(start, stop),)


def chunks_of(values: Values, n: int, dim: int) -> list[Values]:
    """Chunk j of every operand along `dim` (views)."""
    per_operand = [np.split(v, n, axis=dim) for v in values]
    return [tuple(c[j] for c in per_operand) for j in range(n)]


def reduce_specs_into(out: Values, specs: list[list[Values]], combine: Combine, block_bytes: int) -> Values:
    """out = ((s0 + s1) + s2) + ... where s_q = reduce_in_order(specs[q]), for a combine with
    `into` (numpy ufuncs). When every array is C-contiguous, computed block by block (of
    `block_bytes` of the largest output at most: `Thresholds.block_bytes`) so each
    partial of a block stays in cache and `out` is written once: elementwise operations, so the
    blocks give the same bits as whole arrays."""
    arrays = [*out, *(x for spec in specs for v in spec for x in v)]
    if all(x.flags.c_contiguous for x in arrays):
        flat = [o.reshape(-1) for o in out]
        specs = [[tuple(x.reshape(-1) for x in v) for v in spec] for spec in specs]
        blocks = max(1, -(-max(o.nbytes for o in out) // block_bytes))
    else:
        flat, blocks = list(out), 1
    lengths = [o.shape[0] if o.ndim else 1 for o in flat]
    scratch = [tuple(np.empty(o.shape if blocks == 1 else -(-n // blocks), o.dtype) for n, o in zip(lengths, flat))
               if len(spec) > 1 and q else None for q, spec in enumerate(specs)]
    accumulate = combine.accumulate  # type: ignore[attr-defined]
    for j in range(blocks):
        cuts = [slice(n * j // blocks, n * (j + 1) // blocks) for n in lengths] if blocks > 1 else None

        def cut(values: Values, cuts: list[slice] | None = cuts) -> Values:
            return values if cuts is None else tuple(x[c] for x, c in zip(values, cuts))

        o = cut(tuple(flat))
        reduce_into(o, [cut(v) for v in specs[0]], combine)
        for q in range(1, len(specs)):
            spec = specs[q]
            if len(spec) == 1:
                accumulate(o, cut(spec[0]))
            else:
                t = scratch[q] if cuts is None else tuple(x[:c.stop - c.start] for x, c in zip(scratch[q], cuts))
                accumulate(o, reduce_into(t, [cut(v) for v in spec], combine))
    return out


def index_runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted `indices` as (first, count) runs of consecutive integers."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def copy_all(views: Values, arrays: Sequence[np.ndarray]) -> None:
    for view, x in zip(views, arrays):
        np.copyto(view, x)
