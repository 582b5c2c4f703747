"""Shape rule of convolution, and its dimension numbers (`dim_labels`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from replicas.errors import ProgramError
from replicas.hlo.shape_inference.base import (
    Ctx,
    array_shape,
    check_window,
    rule,
    window_output_size,
)
from replicas.hlo.shape_inference.dot import operand_types_agree, result_type
from replicas.shapes import Shape


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
    if not operand_types_agree(lhs.element_type, rhs.element_type):
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
    return array_shape(result_type(c, lhs), dims)
