"""XlaBuilder compute ops: dot, convolution, reductions, windows, sort, map, control flow, fft,
linear algebra, batch norm, random numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replicas.errors import ProgramError
from replicas.hlo.builder.core import BuilderCore, ElementType, XlaOp, as_type
from replicas.hlo.ir import Computation, Instruction, make_window
from replicas.hlo.shape_inference import ConvDimensionNumbers, parse_dim_labels
from replicas.shapes import PrimitiveType, Shape

Padding = str | Sequence[Sequence[int]]


def padding_pairs(padding: Padding, in_sizes: Sequence[int], window: Sequence[int],
                  strides: Sequence[int], what: str) -> list[tuple[int, int]]:
    """Explicit (low, high) pairs, or "SAME"/"SAME_LOWER"/"VALID" resolved as jax's padtype_to_pads."""
    if isinstance(padding, str):
        kind = padding.upper()
        if kind == "VALID":
            return [(0, 0)] * len(in_sizes)
        if kind not in ("SAME", "SAME_LOWER"):
            raise ProgramError(f"{what}: padding must be 'SAME', 'SAME_LOWER', 'VALID' or (low, high) pairs, "
                               f"got {padding!r}")
        pairs = []
        for n, w, s in zip(in_sizes, window, strides):
            out = -(-n // s)
            total = max((out - 1) * s + w - n, 0)
            lo = total // 2 if kind == "SAME" else total - total // 2
            pairs.append((lo, total - lo))
        return pairs
    pairs = [(int(p[0]), int(p[1])) for p in padding]
    if len(pairs) != len(in_sizes):
        raise ProgramError(f"{what}: padding has {len(pairs)} pairs, expected {len(in_sizes)}")
    return pairs


def conv_dimension_numbers(dimension_numbers: Any, rank: int) -> ConvDimensionNumbers:
    """A dim_labels string, a ConvDimensionNumbers, jax-style spec strings ("NCHW", "OIHW", "NCHW"), or
    jax's ConvDimensionNumbers of integer tuples (lhs_spec, rhs_spec, out_spec); None = XLA's default."""
    if dimension_numbers is None:
        spatial = list(range(2, rank))
        return ConvDimensionNumbers(0, 1, spatial, 1, 0, spatial, 0, 1, spatial)
    if isinstance(dimension_numbers, ConvDimensionNumbers):
        return dimension_numbers
    if isinstance(dimension_numbers, str):
        return parse_dim_labels(dimension_numbers)
    try:
        lhs, rhs, out = dimension_numbers
    except (TypeError, ValueError):
        raise ProgramError(f"conv: bad dimension_numbers {dimension_numbers!r}") from None
    if isinstance(lhs, str):
        if not (len(lhs) == len(rhs) == len(out) == rank):
            raise ProgramError(f"conv: dimension spec strings {dimension_numbers!r} must have length {rank}")
        spatial_chars = [ch for ch in rhs if ch not in "OI"]
        try:
            return ConvDimensionNumbers(
                lhs.index("N"), lhs.index("C"), [lhs.index(ch) for ch in spatial_chars],
                rhs.index("I"), rhs.index("O"), [rhs.index(ch) for ch in spatial_chars],
                out.index("N"), out.index("C"), [out.index(ch) for ch in spatial_chars])
        except ValueError:
            raise ProgramError(f"conv: dimension spec strings {dimension_numbers!r} do not match") from None
    lhs, rhs, out = (list(map(int, x)) for x in (lhs, rhs, out))
    return ConvDimensionNumbers(lhs[0], lhs[1], lhs[2:], rhs[1], rhs[0], rhs[2:], out[0], out[1], out[2:])


class ComputeOps(BuilderCore):
    # -- dot ----------------------------------------------------------------------------------------
    def dot(self, lhs: XlaOp, rhs: XlaOp, precision_config: Any = None,
            preferred_element_type: ElementType | None = None) -> XlaOp:
        """XlaBuilder::Dot: contracts the last dimension of lhs with the first of rhs (ranks 1 or 2)."""
        lhs, rhs = self._op(lhs, "lhs"), self._op(rhs, "rhs")
        if lhs.shape.rank not in (1, 2) or rhs.shape.rank not in (1, 2):
            raise ProgramError(f"dot: operands must have rank 1 or 2, got {lhs.shape} and {rhs.shape} "
                               "(use dot_general)")
        return self.dot_general(lhs, rhs, (([lhs.shape.rank - 1], [0]), ([], [])),
                                preferred_element_type=preferred_element_type)

    def dot_general(self, lhs: XlaOp, rhs: XlaOp, dimension_numbers: Any, precision_config: Any = None,
                    preferred_element_type: ElementType | None = None) -> XlaOp:
        """`dimension_numbers` as jax: ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)), or a
        dict with lhs_contracting_dims, rhs_contracting_dims, lhs_batch_dims, rhs_batch_dims."""
        lhs, rhs = self._op(lhs, "lhs"), self._op(rhs, "rhs")
        if isinstance(dimension_numbers, dict):
            attrs = {k: [int(d) for d in dimension_numbers.get(k, ())] for k in
                     ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims")}
        else:
            try:
                (lc, rc), (lb, rb) = dimension_numbers
            except (TypeError, ValueError):
                raise ProgramError(f"dot_general: bad dimension_numbers {dimension_numbers!r}") from None
            attrs = {"lhs_batch_dims": [int(d) for d in lb], "rhs_batch_dims": [int(d) for d in rb],
                     "lhs_contracting_dims": [int(d) for d in lc], "rhs_contracting_dims": [int(d) for d in rc]}
        shape = None
        if preferred_element_type is not None:
            inferred = self._infer("dot", [lhs, rhs], attrs)
            assert inferred is not None
            shape = inferred.with_element_type(as_type(preferred_element_type))
        return self._emit("dot", [lhs, rhs], attrs, shape=shape)

    # -- convolution --------------------------------------------------------------------------------
    def conv_general_dilated(self, lhs: XlaOp, rhs: XlaOp, window_strides: Sequence[int], padding: Padding,
                             lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
                             dimension_numbers: Any = None, feature_group_count: int = 1,
                             batch_group_count: int = 1, precision_config: Any = None,
                             preferred_element_type: ElementType | None = None,
                             window_reversal: Sequence[bool] | None = None) -> XlaOp:
        lhs, rhs = self._op(lhs, "lhs"), self._op(rhs, "rhs")
        dn = conv_dimension_numbers(dimension_numbers, lhs.shape.rank)
        n = dn.num_spatial
        if rhs.shape.rank != n + 2 or lhs.shape.rank != n + 2:
            raise ProgramError(f"conv: operands {lhs.shape} and {rhs.shape} must have rank {n + 2}")
        strides = [int(s) for s in window_strides] if window_strides else [1] * n
        lhs_dilation = [int(d) for d in lhs_dilation] if lhs_dilation else [1] * n
        rhs_dilation = [int(d) for d in rhs_dilation] if rhs_dilation else [1] * n
        size = [rhs.shape.dimensions[d] for d in dn.kernel_spatial]
        in_sizes = [lhs.shape.dimensions[d] for d in dn.input_spatial]
        dilated = [(k - 1) * r + 1 if k else 0 for k, r in zip(size, rhs_dilation)]
        pads = padding_pairs(padding, in_sizes, dilated, strides, "conv")
        if not len(strides) == len(lhs_dilation) == len(rhs_dilation) == n:
            raise ProgramError(f"conv: strides and dilations must have {n} entries (one per spatial dimension)")
        window = make_window(n, size=size, stride=strides, pad=pads, lhs_dilate=lhs_dilation,
                             rhs_dilate=rhs_dilation, window_reversal=window_reversal)
        attrs = {"window": window, "dim_labels": dn.to_labels(),
                 "feature_group_count": int(feature_group_count), "batch_group_count": int(batch_group_count)}
        shape = None
        if preferred_element_type is not None:
            inferred = self._infer("convolution", [lhs, rhs], attrs)
            assert inferred is not None
            shape = inferred.with_element_type(as_type(preferred_element_type))
        return self._emit("convolution", [lhs, rhs], attrs, shape=shape)

    def conv(self, lhs: XlaOp, rhs: XlaOp, window_strides: Sequence[int], padding: Padding,
             feature_group_count: int = 1, batch_group_count: int = 1, dimension_numbers: Any = None,
             precision_config: Any = None, preferred_element_type: ElementType | None = None) -> XlaOp:
        return self.conv_general_dilated(lhs, rhs, window_strides, padding, None, None, dimension_numbers,
                                         feature_group_count, batch_group_count,
                                         preferred_element_type=preferred_element_type)

    def conv_with_general_padding(self, lhs: XlaOp, rhs: XlaOp, window_strides: Sequence[int],
                                  padding: Sequence[Sequence[int]], feature_group_count: int = 1,
                                  batch_group_count: int = 1, dimension_numbers: Any = None,
                                  precision_config: Any = None,
                                  preferred_element_type: ElementType | None = None) -> XlaOp:
        return self.conv_general_dilated(lhs, rhs, window_strides, padding, None, None, dimension_numbers,
                                         feature_group_count, batch_group_count,
                                         preferred_element_type=preferred_element_type)

    def conv_with_general_dimensions(self, lhs: XlaOp, rhs: XlaOp, window_strides: Sequence[int],
                                     padding: Padding, dimension_numbers: Any, feature_group_count: int = 1,
                                     batch_group_count: int = 1) -> XlaOp:
        return self.conv_general_dilated(lhs, rhs, window_strides, padding, None, None, dimension_numbers,
                                         feature_group_count, batch_group_count)

    # -- reductions and windows -----------------------------------------------------------------------
    def reduce(self, operands: XlaOp | Sequence[XlaOp], init_values: Any, computation: Any,
               dimensions_to_reduce: Sequence[int]) -> XlaOp:
        ops = [self._op(o) for o in (operands if isinstance(operands, (list, tuple)) else [operands])]
        inits_in = init_values if isinstance(init_values, (list, tuple)) else [init_values]
        if len(inits_in) != len(ops):
            raise ProgramError(f"reduce: {len(ops)} operands need {len(ops)} init values, got {len(inits_in)}")
        inits = [self._op_or_constant(v, o, "init value") for v, o in zip(inits_in, ops)]
        attrs = {"dimensions": [int(d) for d in dimensions_to_reduce], "to_apply": self._import(computation)}
        return self._emit("reduce", [*ops, *inits], attrs)

    def reduce_all(self, operand: XlaOp, init_value: Any, computation: Any) -> XlaOp:
        return self.reduce(operand, init_value, computation, list(range(self._op(operand).shape.rank)))

    def reduce_window(self, operands: XlaOp | Sequence[XlaOp], init_values: Any, computation: Any,
                      window_dimensions: Sequence[int], window_strides: Sequence[int] | None = None,
                      padding: Padding = "VALID", base_dilations: Sequence[int] | None = None,
                      window_dilations: Sequence[int] | None = None) -> XlaOp:
        ops = [self._op(o) for o in (operands if isinstance(operands, (list, tuple)) else [operands])]
        inits_in = init_values if isinstance(init_values, (list, tuple)) else [init_values]
        if len(inits_in) != len(ops):
            raise ProgramError(f"reduce_window: {len(ops)} operands need {len(ops)} init values")
        inits = [self._op_or_constant(v, o, "init value") for v, o in zip(inits_in, ops)]
        rank = ops[0].shape.rank
        size = [int(w) for w in window_dimensions]
        strides = [int(s) for s in window_strides] if window_strides is not None else [1] * rank
        pads = padding_pairs(padding, ops[0].shape.dimensions, size, strides, "reduce_window")
        window = make_window(len(size), size=size, stride=strides, pad=pads, lhs_dilate=base_dilations,
                             rhs_dilate=window_dilations)
        attrs = {"window": window, "to_apply": self._import(computation)}
        return self._emit("reduce-window", [*ops, *inits], attrs)

    def select_and_scatter(self, operand: XlaOp, select: Any, window_dimensions: Sequence[int],
                           window_strides: Sequence[int], padding: Padding, source: XlaOp, init_value: Any,
                           scatter: Any) -> XlaOp:
        operand = self._op(operand)
        size = [int(w) for w in window_dimensions]
        strides = [int(s) for s in window_strides]
        pads = padding_pairs(padding, operand.shape.dimensions, size, strides, "select_and_scatter")
        init = self._op_or_constant(init_value, operand, "init_value")
        attrs = {"window": make_window(len(size), size=size, stride=strides, pad=pads),
                 "select": self._import(select, "select"), "scatter": self._import(scatter, "scatter")}
        return self._emit("select-and-scatter", [operand, self._op(source, "source"), init], attrs)

    def select_and_scatter_with_general_padding(self, operand: XlaOp, select: Any, window_dimensions: Sequence[int],
                                                window_strides: Sequence[int], padding: Sequence[Sequence[int]],
                                                source: XlaOp, init_value: Any, scatter: Any) -> XlaOp:
        return self.select_and_scatter(operand, select, window_dimensions, window_strides, padding, source,
                                       init_value, scatter)

    def sort(self, operands: XlaOp | Sequence[XlaOp], comparator: Any = None, dimension: int = -1,
             is_stable: bool = False) -> XlaOp:
        """Sort along `dimension`; without a comparator, ascending by the first operand (total order)."""
        ops = [self._op(o) for o in (operands if isinstance(operands, (list, tuple)) else [operands])]
        if not ops:
            raise ProgramError("sort: needs at least one operand")
        rank = ops[0].shape.rank
        d = dimension + rank if dimension < 0 else dimension
        name = self._import(comparator, "comparator") if comparator is not None else self._default_comparator(ops)
        return self._emit("sort", ops, {"dimensions": [int(d)], "is_stable": bool(is_stable), "to_apply": name})

    def _default_comparator(self, ops: list[XlaOp]) -> str:
        types = [o.shape.element_type for o in ops]
        key = "compare_lt_" + "_".join(t.value for t in types)
        if key in self._generated:
            return self._generated[key]
        name = self._computation_name(key)
        self._generated[key] = name
        comp = Computation(name)
        params = []
        for i, t in enumerate(types):
            for side in ("lhs", "rhs"):
                p = self._claim(f"{side}.{i}")
                comp.add(Instruction(p, "parameter", Shape.scalar(t), [], {"parameter_number": len(params)}))
                params.append(p)
        attrs: dict[str, Any] = {"comparison_direction": "LT"}
        if types[0].is_floating:
            attrs["type"] = "TOTALORDER"
        root = self._claim("compare")
        comp.add(Instruction(root, "compare", Shape.scalar(PrimitiveType.PRED), params[:2], attrs))
        comp.root = root
        self._imported[name] = comp
        return name

    def top_k(self, operand: XlaOp, k: int, largest: bool = True) -> XlaOp:
        """The (values, s32 indices) tuple of the k largest (or smallest) along the last dimension."""
        return self._emit("topk", [self._op(operand)], {"k": int(k), "largest": bool(largest)})

    # -- calls and control flow -------------------------------------------------------------------
    def map(self, operands: Sequence[XlaOp], computation: Any, dimensions: Sequence[int] | None = None) -> XlaOp:
        ops = [self._op(o) for o in operands]
        dims = list(range(ops[0].shape.rank)) if dimensions is None else [int(d) for d in dimensions]
        return self._emit("map", ops, {"dimensions": dims, "to_apply": self._import(computation)})

    def call(self, computation: Any, operands: Sequence[XlaOp]) -> XlaOp:
        return self._emit("call", [self._op(o) for o in operands], {"to_apply": self._import(computation)})

    def while_(self, condition: Any, body: Any, init: XlaOp) -> XlaOp:
        attrs = {"condition": self._import(condition, "condition"), "body": self._import(body, "body")}
        return self._emit("while", [self._op(init, "init")], attrs)

    def conditional(self, selector: XlaOp, *args: Any) -> XlaOp:
        """`conditional(pred, true_operand, true_computation, false_operand, false_computation)` or
        `conditional(branch_index, branch_computations, branch_operands)`."""
        selector = self._op(selector, "selector")
        if len(args) == 4:
            true_op, true_comp, false_op, false_comp = args
            attrs = {"true_computation": self._import(true_comp, "true_computation"),
                     "false_computation": self._import(false_comp, "false_computation")}
            return self._emit("conditional", [selector, self._op(true_op), self._op(false_op)], attrs)
        if len(args) == 2:
            comps, operands = args
            if len(comps) != len(operands):
                raise ProgramError(f"conditional: {len(comps)} branch computations but {len(operands)} operands")
            names = [self._import(c, f"branch {i}") for i, c in enumerate(comps)]
            return self._emit("conditional", [selector, *(self._op(o) for o in operands)],
                              {"branch_computations": names})
        raise ProgramError("conditional: give (pred, true_operand, true_computation, false_operand, "
                           "false_computation) or (branch_index, branch_computations, branch_operands)")

    # -- fft and linear algebra -------------------------------------------------------------------
    def fft(self, operand: XlaOp, fft_type: str, fft_length: Sequence[int]) -> XlaOp:
        return self._emit("fft", [self._op(operand)], {"fft_type": str(fft_type).upper(),
                                                       "fft_length": [int(n) for n in fft_length]})

    def cholesky(self, a: XlaOp, lower: bool = True) -> XlaOp:
        return self._emit("cholesky", [self._op(a, "a")], {"lower": bool(lower)})

    def triangular_solve(self, a: XlaOp, b: XlaOp, left_side: bool, lower: bool, unit_diagonal: bool,
                         transpose_a: str = "NO_TRANSPOSE") -> XlaOp:
        attrs = {"left_side": bool(left_side), "lower": bool(lower), "unit_diagonal": bool(unit_diagonal),
                 "transpose_a": str(transpose_a).upper()}
        return self._emit("triangular-solve", [self._op(a, "a"), self._op(b, "b")], attrs)

    def batch_norm_training(self, operand: XlaOp, scale: XlaOp, offset: XlaOp, epsilon: float,
                            feature_index: int) -> XlaOp:
        return self._emit("batch-norm-training", [self._op(x) for x in (operand, scale, offset)],
                          {"epsilon": float(epsilon), "feature_index": int(feature_index)})

    def batch_norm_inference(self, operand: XlaOp, scale: XlaOp, offset: XlaOp, mean: XlaOp, variance: XlaOp,
                             epsilon: float, feature_index: int) -> XlaOp:
        return self._emit("batch-norm-inference", [self._op(x) for x in (operand, scale, offset, mean, variance)],
                          {"epsilon": float(epsilon), "feature_index": int(feature_index)})

    def batch_norm_grad(self, operand: XlaOp, scale: XlaOp, batch_mean: XlaOp, batch_var: XlaOp,
                        grad_output: XlaOp, epsilon: float, feature_index: int) -> XlaOp:
        ops = [self._op(x) for x in (operand, scale, batch_mean, batch_var, grad_output)]
        return self._emit("batch-norm-grad", ops, {"epsilon": float(epsilon), "feature_index": int(feature_index)})

    # -- random numbers -------------------------------------------------------------------------------
    def _rng(self, distribution: str, a: XlaOp, b: XlaOp, shape: Shape | str | Sequence[int]) -> XlaOp:
        a, b = self._op(a), self._op(b)
        if isinstance(shape, str):
            shape = Shape.parse(shape)
        elif not isinstance(shape, Shape):
            shape = Shape.array(a.shape.element_type, [int(d) for d in shape])
        return self._emit("rng", [a, b], {"distribution": distribution}, shape=shape)

    def rng_uniform(self, a: XlaOp, b: XlaOp, shape: Shape | str | Sequence[int]) -> XlaOp:
        return self._rng("rng_uniform", a, b, shape)

    def rng_normal(self, mu: XlaOp, sigma: XlaOp, shape: Shape | str | Sequence[int]) -> XlaOp:
        return self._rng("rng_normal", mu, sigma, shape)

    def rng_bit_generator(self, algorithm: str, initial_state: XlaOp, shape: Shape | str) -> XlaOp:
        """Returns the (new_state, random_bits) tuple, as XlaBuilder::RngBitGenerator."""
        state = self._op(initial_state, "initial_state")
        if isinstance(shape, str):
            shape = Shape.parse(shape)
        algo = str(algorithm).lower()
        if not algo.startswith("rng_"):
            algo = "rng_" + algo
        return self._emit("rng-bit-generator", [state], {"algorithm": algo},
                          shape=Shape.tuple([state.shape.without_layout(), shape]))
