"""Shape rules of the linear-algebra ops: dot, convolution (and the dim_labels parser shared with the
convolution kernel), fft, cholesky, triangular-solve, batch-norm-*."""

from __future__ import annotations

from dataclasses import dataclass, field

from replicas.errors import ProgramError
from replicas.hlo.shape_inference.base import (
    Ctx,
    array_shape,
    check_dims_unique_in_range,
    check_window,
    rule,
    window_output_size,
)
from replicas.shapes import PrimitiveType, Shape


def _operand_types_agree(a: PrimitiveType, b: PrimitiveType) -> bool:
    # XLA compares dot/convolution operand types ignoring floating-point precision.
    return a is b or (a.is_floating and b.is_floating)


def _result_type(c: Ctx, lhs: Shape) -> PrimitiveType:
    # The result element type may differ from the operands' (preferred_element_type); the
    # instruction's declared type then decides.
    if c.result is not None and c.result.is_array:
        return c.result.element_type
    return lhs.element_type


@rule("dot")
def _dot(c: Ctx) -> Shape:
    lhs, rhs = c.array(0, "lhs"), c.array(1, "rhs")
    if not _operand_types_agree(lhs.element_type, rhs.element_type):
        raise c.fail(f"lhs {lhs} and rhs {rhs} must have the same element type")
    lb, rb = c.int_list("lhs_batch_dims", []), c.int_list("rhs_batch_dims", [])
    lc, rc = c.int_list("lhs_contracting_dims", []), c.int_list("rhs_contracting_dims", [])
    if len(lb) != len(rb):
        raise c.fail(f"lhs_batch_dims {lb} and rhs_batch_dims {rb} must have the same length")
    if len(lc) != len(rc):
        raise c.fail(f"lhs_contracting_dims {lc} and rhs_contracting_dims {rc} must have the same length")
    check_dims_unique_in_range(c, lb + lc, lhs.rank, "lhs batch and contracting dimensions")
    check_dims_unique_in_range(c, rb + rc, rhs.rank, "rhs batch and contracting dimensions")
    for a, b in zip(lb, rb):
        if lhs.dimensions[a] != rhs.dimensions[b]:
            raise c.fail(f"batch dimension sizes differ: lhs dimension {a} is {lhs.dimensions[a]}, "
                         f"rhs dimension {b} is {rhs.dimensions[b]}")
    for a, b in zip(lc, rc):
        if lhs.dimensions[a] != rhs.dimensions[b]:
            raise c.fail(f"contracting dimension sizes differ: lhs dimension {a} is {lhs.dimensions[a]}, "
                         f"rhs dimension {b} is {rhs.dimensions[b]}")
    # Result dimension order: batch, then lhs free dimensions, then rhs free dimensions.
    dims = [lhs.dimensions[a] for a in lb]
    dims += [d for i, d in enumerate(lhs.dimensions) if i not in lb and i not in lc]
    dims += [d for i, d in enumerate(rhs.dimensions) if i not in rb and i not in rc]
    return array_shape(_result_type(c, lhs), dims)


@dataclass
class ConvDimensionNumbers:
    """Where each logical dimension of a convolution lives (parsed from `dim_labels`)."""

    input_batch: int
    input_feature: int
    input_spatial: list[int] = field(default_factory=list)
    kernel_input_feature: int = 0
    kernel_output_feature: int = 0
    kernel_spatial: list[int] = field(default_factory=list)
    output_batch: int = 0
    output_feature: int = 0
    output_spatial: list[int] = field(default_factory=list)

    @property
    def num_spatial(self) -> int:
        return len(self.input_spatial)

    def to_labels(self) -> str:
        """The `dim_labels` string, e.g. "b01f_01io->b01f"."""
        def spell(rank: int, named: dict[int, str], spatial: list[int]) -> str:
            chars = [""] * rank
            for pos, ch in named.items():
                chars[pos] = ch
            for k, pos in enumerate(spatial):
                chars[pos] = str(k)
            return "".join(chars)

        n = self.num_spatial + 2
        lhs = spell(n, {self.input_batch: "b", self.input_feature: "f"}, self.input_spatial)
        rhs = spell(n, {self.kernel_input_feature: "i", self.kernel_output_feature: "o"}, self.kernel_spatial)
        out = spell(n, {self.output_batch: "b", self.output_feature: "f"}, self.output_spatial)
        return f"{lhs}_{rhs}->{out}"


def parse_dim_labels(s: str) -> ConvDimensionNumbers:
    """Parse XLA's convolution `dim_labels` ("b01f_01io->b01f"); raises ProgramError if malformed."""
    if not isinstance(s, str) or "->" not in s or "_" not in s.split("->")[0]:
        raise ProgramError(f"convolution: malformed dim_labels {s!r} (expected e.g. 'b01f_01io->b01f')")
    left, out = s.split("->", 1)
    lhs, rhs = left.split("_", 1)
    if not (len(lhs) == len(rhs) == len(out)):
        raise ProgramError(f"convolution: dim_labels {s!r}: lhs, rhs and output must have the same rank")
    n_spatial = len(lhs) - 2

    def parse(part: str, letters: str, what: str) -> tuple[int, int, list[int]]:
        expected = set(letters) | {str(k) for k in range(n_spatial)}
        if len(part) != len(set(part)) or set(part) != expected:
            raise ProgramError(f"convolution: dim_labels {s!r}: {what} {part!r} must hold each of "
                               f"{''.join(sorted(expected))} exactly once")
        return part.index(letters[0]), part.index(letters[1]), [part.index(str(k)) for k in range(n_spatial)]

    if n_spatial > 10:
        raise ProgramError(f"convolution: dim_labels {s!r} has more than 10 spatial dimensions")
    ib, if_, isp = parse(lhs, "bf", "input")
    ki, ko, ksp = parse(rhs, "io", "kernel")
    ob, of, osp = parse(out, "bf", "output")
    return ConvDimensionNumbers(ib, if_, isp, ki, ko, ksp, ob, of, osp)


@rule("convolution")
def _convolution(c: Ctx) -> Shape:
    lhs, rhs = c.array(0, "lhs"), c.array(1, "rhs")
    if not _operand_types_agree(lhs.element_type, rhs.element_type):
        raise c.fail(f"lhs {lhs} and rhs {rhs} must have the same element type")
    try:
        dn = parse_dim_labels(c.attr("dim_labels"))
    except ProgramError as e:
        raise c.fail(str(e).removeprefix("convolution: ")) from None
    n = dn.num_spatial
    if lhs.rank != n + 2 or rhs.rank != n + 2:
        raise c.fail(f"dim_labels {c.attrs['dim_labels']} needs rank {n + 2} operands, got {lhs} and {rhs}")
    fgc = int(c.attr("feature_group_count", 1))
    bgc = int(c.attr("batch_group_count", 1))
    if fgc < 1 or bgc < 1:
        raise c.fail(f"feature_group_count {fgc} and batch_group_count {bgc} must be positive")
    if fgc > 1 and bgc > 1:
        raise c.fail("feature_group_count and batch_group_count cannot both be greater than 1")
    in_batch, in_features = lhs.dimensions[dn.input_batch], lhs.dimensions[dn.input_feature]
    k_in, k_out = rhs.dimensions[dn.kernel_input_feature], rhs.dimensions[dn.kernel_output_feature]
    if in_features % fgc:
        raise c.fail(f"input feature size {in_features} is not divisible by feature_group_count {fgc}")
    if in_features // fgc != k_in:
        raise c.fail(f"input feature size {in_features} / feature_group_count {fgc} must equal the kernel "
                     f"input feature size {k_in}")
    if k_out % fgc:
        raise c.fail(f"kernel output feature size {k_out} is not divisible by feature_group_count {fgc}")
    if k_out % bgc:
        raise c.fail(f"kernel output feature size {k_out} is not divisible by batch_group_count {bgc}")
    if in_batch % bgc:
        raise c.fail(f"input batch size {in_batch} is not divisible by batch_group_count {bgc}")
    w = check_window(c, c.attr("window", None) or {"size": [rhs.dimensions[d] for d in dn.kernel_spatial]}, n)
    out_spatial = []
    for k in range(n):
        ksize = rhs.dimensions[dn.kernel_spatial[k]]
        if w["size"][k] != ksize:
            raise c.fail(f"window size {w['size'][k]} in spatial dimension {k} does not match the kernel "
                         f"size {ksize}")
        out_spatial.append(window_output_size(c, lhs.dimensions[dn.input_spatial[k]], ksize, w["stride"][k],
                                              tuple(w["pad"][k]), w["lhs_dilate"][k], w["rhs_dilate"][k], k))
    dims = [0] * (n + 2)
    dims[dn.output_batch] = in_batch // bgc
    dims[dn.output_feature] = k_out
    for k, pos in enumerate(dn.output_spatial):
        dims[pos] = out_spatial[k]
    return array_shape(_result_type(c, lhs), dims)


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


def _check_matrix(c: Ctx, s: Shape, what: str) -> None:
    if s.rank < 2:
        raise c.fail(f"{what} {s} must have rank at least 2")
    if not (s.element_type.is_floating or s.element_type.is_complex):
        raise c.fail(f"{what} {s} must be floating-point or complex")


@rule("cholesky")
def _cholesky(c: Ctx) -> Shape:
    a = c.array(0, "a")
    _check_matrix(c, a, "a")
    if a.dimensions[-1] != a.dimensions[-2]:
        raise c.fail(f"a {a} must be square in its two minor dimensions")
    return a


@rule("triangular-solve")
def _triangular_solve(c: Ctx) -> Shape:
    a, b = c.array(0, "a"), c.array(1, "b")
    _check_matrix(c, a, "a")
    _check_matrix(c, b, "b")
    if a.element_type is not b.element_type:
        raise c.fail(f"a {a} and b {b} must have the same element type")
    if a.rank != b.rank or a.dimensions[:-2] != b.dimensions[:-2]:
        raise c.fail(f"a {a} and b {b} must have the same batch dimensions")
    if a.dimensions[-1] != a.dimensions[-2]:
        raise c.fail(f"a {a} must be square in its two minor dimensions")
    left = bool(c.attr("left_side", False))
    shared = b.dimensions[-2] if left else b.dimensions[-1]
    if shared != a.dimensions[-1]:
        side = "rows" if left else "columns"
        raise c.fail(f"b {b} must have {a.dimensions[-1]} {side} to match a {a} (left_side={left})")
    transpose = c.attr("transpose_a", "NO_TRANSPOSE")
    if transpose not in ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"):
        raise c.fail(f"transpose_a must be NO_TRANSPOSE, TRANSPOSE or ADJOINT, got {transpose!r}")
    return b


def _feature_vector(c: Ctx, i: int, what: str, operand: Shape, feature_index: int) -> None:
    s = c.array(i, what)
    n = operand.dimensions[feature_index]
    if s.rank != 1 or s.dimensions[0] != n or s.element_type is not operand.element_type:
        raise c.fail(f"{what} {s} must be a rank-1 {operand.element_type.value}[{n}] "
                     f"(the size of feature dimension {feature_index})")


def _batch_norm_operand(c: Ctx) -> tuple[Shape, int]:
    x = c.array(0, "operand")
    if not x.element_type.is_floating:
        raise c.fail(f"operand {x} must be floating-point")
    f = int(c.attr("feature_index"))
    if not 0 <= f < x.rank:
        raise c.fail(f"feature_index {f} out of range for rank {x.rank} operand")
    eps = c.attr("epsilon")
    if not isinstance(eps, (int, float)):
        raise c.fail(f"epsilon must be a number, got {eps!r}")
    return x, f


@rule("batch-norm-training")
def _batch_norm_training(c: Ctx) -> Shape:
    x, f = _batch_norm_operand(c)
    _feature_vector(c, 1, "scale", x, f)
    _feature_vector(c, 2, "offset", x, f)
    v = array_shape(x.element_type, [x.dimensions[f]])
    return Shape.tuple([x, v, v])


@rule("batch-norm-inference")
def _batch_norm_inference(c: Ctx) -> Shape:
    x, f = _batch_norm_operand(c)
    for i, what in enumerate(("scale", "offset", "mean", "variance"), start=1):
        _feature_vector(c, i, what, x, f)
    return x


@rule("batch-norm-grad")
def _batch_norm_grad(c: Ctx) -> Shape:
    x, f = _batch_norm_operand(c)
    for i, what in enumerate(("scale", "mean", "variance"), start=1):
        _feature_vector(c, i, what, x, f)
    g = c.array(4, "grad_output")
    if not g.compatible(x):
        raise c.fail(f"grad_output {g} must have the operand's shape {x}")
    v = array_shape(x.element_type, [x.dimensions[f]])
    return Shape.tuple([x, v, v])
