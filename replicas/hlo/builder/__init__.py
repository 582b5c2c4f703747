"""XlaBuilder: build a Module op by op, with the ops of XLA's Operation Semantics page.

    adder = XlaBuilder("add")                       # sub-computations are built the same way
    add = adder.build(adder.parameter(0, "f32[]") + adder.parameter(1, "f32[]"))
    b = XlaBuilder("main", replica_count=4)
    x = b.parameter(0, Shape.parse("f32[4,8]"), "x")
    m = b.build(b.all_reduce(x * 2.0, add))         # a Module; `add` is copied in

Every op infers its shape when it is added (ProgramError naming the op and the rule otherwise);
instructions follow docs/ir.md, are named `<opcode>.<n>` (unique in the module) and keep their
creation order. The methods live in one mixin per op family (`builder/<family>.py`, named as in `replicas/ops/`).
"""

from __future__ import annotations

from collections.abc import Sequence

from replicas.errors import ProgramError
from replicas.hlo.builder.batch_norm import BatchNormOps
from replicas.hlo.builder.channels import ChannelOps
from replicas.hlo.builder.collectives import CollectiveOps, format_source_target_pairs
from replicas.hlo.builder.compare import CompareOps
from replicas.hlo.builder.control_flow import ControlFlowOps
from replicas.hlo.builder.convert import ConvertOps
from replicas.hlo.builder.convolution import ConvolutionOps, conv_dimension_numbers, padding_pairs
from replicas.hlo.builder.core import XlaOp
from replicas.hlo.builder.custom_call import CustomCallOps
from replicas.hlo.builder.dot import DotOps
from replicas.hlo.builder.dynamic_shapes import DynamicShapeOps
from replicas.hlo.builder.elementwise_binary import ElementwiseBinaryOps
from replicas.hlo.builder.elementwise_unary import ElementwiseUnaryOps
from replicas.hlo.builder.fft import FftOps
from replicas.hlo.builder.gather import GatherOps
from replicas.hlo.builder.linalg import LinalgOps
from replicas.hlo.builder.reduce import ReduceOps
from replicas.hlo.builder.reduce_window import ReduceWindowOps
from replicas.hlo.builder.rng import RngOps
from replicas.hlo.builder.scatter import ScatterOps
from replicas.hlo.builder.select import SelectOps
from replicas.hlo.builder.shape_ops import ShapeOps
from replicas.hlo.builder.slicing import SlicingOps
from replicas.hlo.builder.sort import SortOps
from replicas.hlo.builder.topk import TopKOps
from replicas.hlo.builder.tuples import TupleOps
from replicas.hlo.ir import Computation, Instruction, Module


class XlaBuilder(BatchNormOps, ChannelOps, CollectiveOps, CompareOps, ControlFlowOps, ConvertOps, ConvolutionOps,
                 CustomCallOps, DotOps, DynamicShapeOps, ElementwiseBinaryOps, ElementwiseUnaryOps,
                 FftOps, GatherOps, LinalgOps, ReduceOps, ReduceWindowOps, RngOps, ScatterOps, SelectOps,
                 ShapeOps, SlicingOps, SortOps, TopKOps, TupleOps):
    """Builds one computation (the entry of the Module `build` returns)."""

    def __init__(self, name: str, replica_count: int | None = None) -> None:
        super().__init__(name, replica_count)

    def build(self, root: XlaOp | Sequence[XlaOp] | None = None) -> Module:
        """The Module whose entry is this builder's computation, rooted at `root` (a list or tuple of
        ops becomes a tuple root; None means the last op added). Called computations come first."""
        if isinstance(root, (list, tuple)):
            root = self.tuple(list(root))
        if root is None:
            if not self._computation.instructions:
                raise ProgramError(f"XlaBuilder {self.name!r}: nothing to build (no instructions)")
            root_name = self._computation.instructions[-1].name
        else:
            root_name = self._op(root, "root").name
        module = Module(self.name)
        for name, comp in self._imported.items():
            module.add(_copy(comp, name))
        entry = _copy(self._computation, self.name)
        entry.root = root_name
        module.add(entry)
        module.entry = self.name
        if self.replica_count is not None:
            module.attrs["replica_count"] = self.replica_count
        return module


def _copy(comp: Computation, name: str) -> Computation:
    out = Computation(name, is_fusion=comp.is_fusion)
    for inst in comp.instructions:
        out.add(Instruction(inst.name, inst.opcode, inst.shape, list(inst.operands), dict(inst.attrs), inst.line))
    out.root = comp.root
    return out


__all__ = ["XlaBuilder", "XlaOp", "conv_dimension_numbers", "padding_pairs", "format_source_target_pairs"]
