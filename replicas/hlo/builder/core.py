"""The XlaBuilder's core: the `XlaOp` handle, instruction emission with shape inference, unique
names, and importing sub-computations (built `Module`s) into the module being built."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from replicas.errors import ProgramError
from replicas.hlo.ir import COMPUTATION_ATTRS, Computation, Instruction, Module
from replicas.hlo.shape_inference import infer_shape
from replicas.shapes import PrimitiveType, Shape

ElementType = PrimitiveType | str | np.dtype | type


def as_type(t: ElementType) -> PrimitiveType:
    if isinstance(t, PrimitiveType):
        return t
    if isinstance(t, str):
        return PrimitiveType.parse(t)
    return PrimitiveType.from_dtype(t)


class XlaOp:
    """A handle to one instruction of the computation an XlaBuilder is building."""

    __slots__ = ("builder", "name", "shape")

    def __init__(self, builder: Any, name: str, shape: Shape) -> None:
        self.builder = builder
        self.name = name
        self.shape = shape

    def __repr__(self) -> str:
        return f"XlaOp(%{self.name}: {self.shape})"

    # Python operators build the matching element-wise op; Python scalars become constants of the
    # op's element type.
    def __add__(self, other: Any) -> XlaOp:
        return self.builder.add(self, other)

    def __radd__(self, other: Any) -> XlaOp:
        return self.builder.add(other, self)

    def __sub__(self, other: Any) -> XlaOp:
        return self.builder.sub(self, other)

    def __rsub__(self, other: Any) -> XlaOp:
        return self.builder.sub(other, self)

    def __mul__(self, other: Any) -> XlaOp:
        return self.builder.mul(self, other)

    def __rmul__(self, other: Any) -> XlaOp:
        return self.builder.mul(other, self)

    def __truediv__(self, other: Any) -> XlaOp:
        return self.builder.div(self, other)

    def __rtruediv__(self, other: Any) -> XlaOp:
        return self.builder.div(other, self)

    def __pow__(self, other: Any) -> XlaOp:
        return self.builder.pow(self, other)

    def __neg__(self) -> XlaOp:
        return self.builder.neg(self)

    def __matmul__(self, other: Any) -> XlaOp:
        return self.builder.dot(self, other)

    def __and__(self, other: Any) -> XlaOp:
        return self.builder.and_(self, other)

    def __or__(self, other: Any) -> XlaOp:
        return self.builder.or_(self, other)

    def __xor__(self, other: Any) -> XlaOp:
        return self.builder.xor(self, other)

    def __invert__(self) -> XlaOp:
        return self.builder.not_(self)


class BuilderCore:
    """State and plumbing shared by the op mixins."""

    def __init__(self, name: str, replica_count: int | None = None) -> None:
        if not name or not isinstance(name, str):
            raise ProgramError(f"XlaBuilder needs a non-empty name, got {name!r}")
        if replica_count is not None and (not isinstance(replica_count, int) or replica_count < 1):
            raise ProgramError(f"replica_count must be a positive integer, got {replica_count!r}")
        self.name = name
        self.replica_count = replica_count
        self._computation = Computation(name)
        self._imported: dict[str, Computation] = {}  # sub-computations, in import order
        self._import_cache: dict[int, tuple[Module, str]] = {}
        self._generated: dict[str, str] = {}  # key of a builder-made computation -> its name here
        self._used_names: set[str] = set()
        self._counter = 0
        self._next_channel = 1
        self._parameters: dict[int, XlaOp] = {}

    # -- names ---------------------------------------------------------------------------------
    def _unique(self, base: str) -> str:
        while True:
            self._counter += 1
            name = f"{base}.{self._counter}"
            if name not in self._used_names:
                self._used_names.add(name)
                return name

    def _claim(self, name: str) -> str:
        if name in self._used_names:
            return self._unique(name)
        self._used_names.add(name)
        return name

    def _channel_id(self, channel_id: int | None) -> int:
        if channel_id is None:
            channel_id = self._next_channel
        if not isinstance(channel_id, (int, np.integer)) or channel_id < 0:
            raise ProgramError(f"channel_id must be a non-negative integer, got {channel_id!r}")
        self._next_channel = max(self._next_channel, int(channel_id) + 1)
        return int(channel_id)

    # -- operands ------------------------------------------------------------------------------
    def _op(self, x: Any, what: str = "operand") -> XlaOp:
        if isinstance(x, XlaOp):
            if x.builder is not self:
                raise ProgramError(f"{what} %{x.name} belongs to builder {x.builder.name!r}, not {self.name!r}")
            return x
        raise ProgramError(f"{what} must be an XlaOp of builder {self.name!r}, got {type(x).__name__}")

    def _op_or_constant(self, x: Any, like: Any, what: str = "operand") -> XlaOp:
        """`x` as an XlaOp; a Python/numpy scalar becomes a constant of `like`'s element type."""
        if isinstance(x, XlaOp):
            return self._op(x, what)
        if isinstance(x, (bool, int, float, complex, np.generic)) and isinstance(like, XlaOp):
            return self.constant(np.asarray(x, dtype=like.shape.dtype))
        if isinstance(x, (bool, int, float, complex, np.generic, np.ndarray)):
            return self.constant(x)
        raise ProgramError(f"{what} must be an XlaOp or a number, got {type(x).__name__}")

    def _index_op(self, x: Any, what: str = "index") -> XlaOp:
        if isinstance(x, XlaOp):
            return self._op(x, what)
        return self.constant(np.asarray(x, dtype=np.int32))

    def get_shape(self, op: XlaOp) -> Shape:
        return self._op(op).shape

    # -- emission ------------------------------------------------------------------------------
    def _lookup(self, name: str) -> Computation:
        comp = self._imported.get(name)
        if comp is None:
            raise ProgramError(f"builder {self.name!r} has no computation {name!r}")
        return comp

    def _infer(self, opcode: str, operands: Sequence[XlaOp], attrs: dict[str, Any],
               result: Shape | None = None, num_replicas: int | None = None) -> Shape | None:
        try:
            return infer_shape(opcode, [o.shape for o in operands], attrs, self._lookup, result=result,
                               num_replicas=num_replicas)
        except ProgramError as e:
            raise ProgramError(f"XlaBuilder {self.name!r}: {e}") from None

    def _emit(self, opcode: str, operands: Sequence[XlaOp], attrs: dict[str, Any] | None = None, *,
              shape: Shape | None = None, name: str | None = None, num_replicas: int | None = None) -> XlaOp:
        """Append an instruction; its shape is inferred (or `shape`, checked against inference)."""
        attrs = {k: v for k, v in (attrs or {}).items() if v is not None}
        operands = [self._op(o) for o in operands]
        inferred = self._infer(opcode, operands, attrs, result=shape, num_replicas=num_replicas)
        if inferred is None:
            if shape is None:
                raise ProgramError(f"XlaBuilder {self.name!r}: {opcode}: the result shape cannot be inferred")
            result = shape
        else:
            if shape is not None and not inferred.compatible(shape):
                raise ProgramError(f"XlaBuilder {self.name!r}: {opcode}: shape {shape} does not match the "
                                   f"inferred shape {inferred}")
            result = shape if shape is not None else inferred
        inst_name = self._claim(name) if name else self._unique(opcode)
        inst = Instruction(inst_name, opcode, result, [o.name for o in operands], attrs)
        self._computation.add(inst)
        return XlaOp(self, inst_name, result)

    # -- sub-computations ------------------------------------------------------------------------
    def _import(self, computation: Module | Computation, what: str = "computation") -> str:
        """Copy a built sub-computation (and everything it calls) in; return its name here."""
        if isinstance(computation, Computation):
            module = Module(computation.name, {computation.name: computation}, computation.name)
        elif isinstance(computation, Module):
            module = computation
        else:
            raise ProgramError(f"{what} must be a Module built by another XlaBuilder, got "
                               f"{type(computation).__name__}")
        cached = self._import_cache.get(id(computation))
        if cached is not None and cached[0] is computation:
            return cached[1]
        if module.entry not in module.computations:
            raise ProgramError(f"{what} {module.name!r} has no entry computation")
        renamed: dict[str, str] = {}
        for old in module.computations:
            new = old
            k = 0
            while new in self._imported or new == self.name or new in renamed.values():
                k += 1
                new = f"{old}.{k}"
            renamed[old] = new
        for old, comp in module.computations.items():
            self._imported[renamed[old]] = self._copy_computation(comp, renamed[old], renamed)
        entry = renamed[module.entry]
        self._import_cache[id(computation)] = (computation, entry)
        return entry

    def _copy_computation(self, comp: Computation, new_name: str, renamed: dict[str, str]) -> Computation:
        names: dict[str, str] = {}
        for inst in comp.instructions:
            names[inst.name] = self._claim(inst.name)
        out = Computation(new_name, is_fusion=comp.is_fusion)
        for inst in comp.instructions:
            attrs = dict(inst.attrs)
            for key in COMPUTATION_ATTRS:
                value = attrs.get(key)
                if isinstance(value, str):
                    attrs[key] = renamed.get(value, value)
                elif isinstance(value, (list, tuple)):
                    attrs[key] = [renamed.get(v, v) for v in value]
            out.add(Instruction(names[inst.name], inst.opcode, inst.shape,
                                [names.get(o, o) for o in inst.operands], attrs, inst.line))
        out.root = names.get(comp.root, comp.root)
        return out

    def _scalar_computation(self, opcode: str, element_type: PrimitiveType, **attrs: Any) -> str:
        """A `(a, b) -> opcode(a, b)` scalar computation (adder, comparator) added to this module."""
        key = f"{opcode}_{element_type.value}" + "".join(f"_{v}" for v in attrs.values())
        if key in self._generated:
            return self._generated[key]
        name = self._computation_name(key.replace("-", "_"))
        self._generated[key] = name
        s = Shape.scalar(element_type)
        comp = Computation(name)
        a, b = self._claim("lhs"), self._claim("rhs")
        comp.add(Instruction(a, "parameter", s, [], {"parameter_number": 0}))
        comp.add(Instruction(b, "parameter", s, [], {"parameter_number": 1}))
        out = Shape.scalar(PrimitiveType.PRED) if opcode == "compare" else s
        r = self._claim(opcode)
        comp.add(Instruction(r, opcode, out, [a, b], dict(attrs)))
        comp.root = r
        self._imported[name] = comp
        return name

    def _computation_name(self, base: str) -> str:
        name, k = base, 0
        while name in self._imported or name == self.name:
            k += 1
            name = f"{base}.{k}"
        return name

    # -- constants and parameters ----------------------------------------------------------------
    def constant(self, value: Any, dtype: ElementType | None = None) -> XlaOp:
        """A constant from a numpy array or Python scalar (int -> s32, float -> f32, bool -> pred,
        complex -> c64 unless `dtype` or the numpy value says otherwise)."""
        if dtype is not None:
            arr = np.asarray(value, dtype=as_type(dtype).dtype)
        elif isinstance(value, bool):
            arr = np.asarray(value, dtype=np.bool_)
        elif isinstance(value, int):
            arr = np.asarray(value, dtype=np.int32)
        elif isinstance(value, float):
            arr = np.asarray(value, dtype=np.float32)
        elif isinstance(value, complex):
            arr = np.asarray(value, dtype=np.complex64)
        else:
            arr = np.asarray(value)
            if arr.dtype == np.float64 and not isinstance(value, (np.ndarray, np.generic)):
                arr = arr.astype(np.float32)
            elif arr.dtype == np.int64 and not isinstance(value, (np.ndarray, np.generic)):
                arr = arr.astype(np.int32)
        shape = Shape.array(PrimitiveType.from_dtype(arr.dtype), arr.shape)
        literal = np.array(arr, copy=True)
        literal.setflags(write=False)
        return self._emit("constant", [], {"literal": literal}, shape=shape)

    def constant_r0(self, value: Any, dtype: ElementType | None = None) -> XlaOp:
        if np.ndim(value) != 0:
            raise ProgramError(f"constant_r0 needs a scalar, got shape {np.shape(value)}")
        return self.constant(value, dtype)

    def constant_r1(self, values: Any, dtype: ElementType | None = None) -> XlaOp:
        if np.ndim(values) != 1:
            raise ProgramError(f"constant_r1 needs a rank-1 value, got shape {np.shape(values)}")
        return self.constant(values, dtype)

    def constant_r2(self, values: Any, dtype: ElementType | None = None) -> XlaOp:
        if np.ndim(values) != 2:
            raise ProgramError(f"constant_r2 needs a rank-2 value, got shape {np.shape(values)}")
        return self.constant(values, dtype)

    def zero(self, element_type: ElementType) -> XlaOp:
        return self.constant(0, element_type)

    def one(self, element_type: ElementType) -> XlaOp:
        return self.constant(1, element_type)

    def parameter(self, parameter_number: int, shape: Shape | str, name: str | None = None) -> XlaOp:
        if isinstance(shape, str):
            shape = Shape.parse(shape)
        if not isinstance(parameter_number, int) or parameter_number < 0:
            raise ProgramError(f"parameter number must be a non-negative integer, got {parameter_number!r}")
        if parameter_number in self._parameters:
            raise ProgramError(f"XlaBuilder {self.name!r}: parameter {parameter_number} is already defined "
                               f"(%{self._parameters[parameter_number].name})")
        op = self._emit("parameter", [], {"parameter_number": parameter_number}, shape=shape, name=name)
        self._parameters[parameter_number] = op
        return op
