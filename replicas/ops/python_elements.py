"""Small element-wise fusions and While loops as unrolled per-element Python code: no numpy call per op.

A fusion of tiny arrays (threefry's rounds on u32[2], a sampler's polynomial on f32[2]) costs a
numpy call of about a microsecond per op, whatever the size, and a While loop of them pays that
every trip. `compile_fusion` turns such a fusion into one Python function, and `compile_loop` a
whole While loop (its condition, body, the fusions, calls and nested loops they run) into one
Python `while` over the state's elements: the operands' elements become Python numbers once
(`tolist`), each op is one statement per element (`ops.element_ops`, numpy's bits), the layout
ops (broadcast, reshape, slice, concatenate, transpose, tuples) are renamings decided while
generating, and the result is built once (`np.array`). Ops without a Python form run their own
numpy kernel on the few elements. Either is used only when every value is small
(`MAX_ELEMENTS`) and the cost model says it is cheaper than the numpy kernels. A call that meets an
f32 signaling NaN (an operand's, or a bitcast's), which a Python float cannot hold, runs on the
numpy kernels instead.

A compiled loop notices a cancel, timeout or deadlock abort at each trip's start, as the
interpreter's loops do; the interpreter's `current` instruction stays the While's. A loop that runs
long enough moves on to machine code with the same bits (`ops.machine`: its trip emitted as LLVM IR).
"""

from __future__ import annotations

import itertools
import math
import re
import struct
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.hlo.ir import Computation, Instruction
from replicas.hlo.opcodes import opcode as opcode_record
from replicas.ops import element_ops
from replicas.ops.element_layout import Refused, layout
from replicas.ops.element_ops import BITCAST, DEFAULT_NAN, TYPES, divide_by_zero, rounds, writer
from replicas.ops.elementwise_util import WithOperandShapes
from replicas.ops.machine import loops as machine_loops
from replicas.ops.registry import KernelContext, lookup
from replicas.shapes import PrimitiveType, Shape

P = PrimitiveType

# The first start operand of the slicing ops whose scalar starts may be Python ints (ops/slicing.py).
_SLICE_STARTS = {"dynamic-slice": 1, "dynamic-update-slice": 2}
_NAME = re.compile(r"[A-Za-z_]\w*")
# No value may have more elements than this (the code is unrolled per element).
MAX_ELEMENTS = 16
# In a loop, where arrays may stay numpy arrays, values of up to this many elements are Python numbers.
LOOP_ELEMENTS = 8
MAX_STATEMENTS = 6000
# A loop whose condition folds (constant bounds) is unrolled up to this many trips and statements.
MAX_UNROLLED = 16
MAX_UNROLLED_STATEMENTS = 1500
MAX_UNROLLED_CALLS = 300  # numpy calls: past them, writing the trips out costs binding time for little
UNROLL_GAIN = 0.9  # unrolled trips must cost at most this share of the rolled loop's
# The cost model, in units of one numpy call on a tiny array: an element's Python statement, an
# operand's or result's conversion, an op left to its numpy kernel (its arrays built and read back),
# a layout op's view (reshape, slice, broadcast_to: cheaper than a ufunc).
ELEMENT_COST = 0.06
CONVERSION_COST = 0.6
KERNEL_COST = 3.0
LAYOUT_CALL = 0.5
LOOP_TRIP_COST = 2.0  # the interpreter's loop: a condition's and a body's call and checks per trip

_FALLBACK_FAMILIES = frozenset({"elementwise_unary", "elementwise_binary", "select", "convert", "compare"})
_LAYOUT = frozenset({"broadcast", "reshape", "bitcast", "copy", "slice", "concatenate", "transpose", "reverse",
                     "iota"})
# The ops a loop may run as numpy kernels on arrays: pure, no communication, feed or state.
_ARRAY_FAMILIES = _FALLBACK_FAMILIES | {"constants", "shape_ops", "slicing", "gather", "scatter", "dot",
                                         "convolution", "fft", "reduce", "reduce_window", "sort", "topk"}
# A loop updating a larger array (dynamic-update-slice copies here) keeps the interpreter's loop,
# which updates it in place.
MAX_COPIED = 2048



class _Array:
    """A value a loop keeps as a numpy array (too large, or made by a kernel): the generated variable
    (or global) holding it."""

    __slots__ = ("name", "shape", "broadcast")

    def __init__(self, name: str, shape: Shape, broadcast: tuple[str, str] | None = None) -> None:
        self.name = name
        self.shape = shape
        # A broadcast not made yet: `name` holds its operand reshaped with 1s in the new dimensions
        # (what an element-wise ufunc reads through numpy's broadcasting); (operand, kernel) make it.
        self.broadcast = broadcast


# A value while generating: an array's elements (Python texts, row-major), an array, or a tuple of values.
Value = list[str] | _Array | tuple["Value", ...]


_Refused = Refused  # the computation has something this code generator does not write


def compile_fusion(comp: Computation, ctx: KernelContext, *, cost_model: bool = True) -> Callable[..., Any] | None:
    """`comp` (a fusion's computation, arrays in and out) as per-element Python code, or None when
    it is not small and element-wise, or the numpy kernels would cost less (unless not `cost_model`)."""
    if not all(_small(inst.shape) for inst in comp.instructions):
        return None  # a large value: known before anything is generated (most fusions of a model)
    try:
        gen = _Generator(ctx, cost_model)
        params = sorted(comp.parameters, key=lambda p: p.attrs["parameter_number"])
        args = [gen.unpack(f"a{k}", p.shape) for k, p in enumerate(params)]
        result = gen.computation(comp, args)
        return gen.finish([f"a{k}" for k in range(len(params))], comp.root_instruction.shape, result,
                          len(params), comp.name)
    except _Refused:
        return None


def compile_loop(inst: Instruction, ctx: KernelContext) -> Callable[[Any], Any] | None:
    """The While `inst` as one Python loop over its state's elements (`state -> state`), or None."""
    try:
        gen = _Generator(ctx, arrays=True)
        state = gen.unpack("a0", inst.shape, _constant_elements(inst, ctx))
        result = gen.loop(inst, state)
        run = gen.finish(["a0"], inst.shape, result, len(_leaves(inst.shape)), inst.name)
        return machine_loops.tiered(run, gen.text, gen.env, gen.statements)
    except _Refused:
        return None


def _constant_elements(inst: Instruction, ctx: KernelContext) -> dict[int, Instruction]:
    """The state elements of the While `inst` its caller makes from constants (through copies), by
    index: known now, so a counted loop from them can be unrolled."""
    binding = getattr(ctx, "binding_computation", None)
    caller = binding() if binding is not None else None
    if caller is None or not inst.shape.is_tuple:
        return {}
    made = caller.by_name.get(inst.operands[0])
    if made is None or made.opcode != "tuple" or inst.name not in caller.by_name:
        return {}
    found = {}
    for k, name in enumerate(made.operands):
        source = caller.by_name[name]
        while source.opcode == "copy":
            source = caller.by_name[source.operands[0]]
        if source.opcode == "constant" and _elemental(source.shape):
            found[k] = source
    return found


def _leaves(shape: Shape) -> list[Shape]:
    return [shape] if not shape.is_tuple else [leaf for s in shape.tuple_shapes for leaf in _leaves(s)]


def _default_layout(shape: Shape) -> bool:
    return shape.layout is None or shape.layout.minor_to_major == tuple(range(shape.rank - 1, -1, -1))


def small_state(inst: Instruction) -> bool:
    """Whether the While `inst` keeps its whole state as Python numbers (`compile_loop` may take it)."""
    return _small(inst.shape)


def _small(shape: Shape) -> bool:
    return all(_elemental(s) for s in _leaves(shape))


def _elemental(shape: Shape, limit: int = MAX_ELEMENTS) -> bool:
    """An array kept as Python numbers, one per element."""
    return (shape.is_array and shape.element_type in TYPES and 0 < shape.numel <= limit
            and _default_layout(shape))


class _Generator:
    def __init__(self, ctx: KernelContext, cost_model: bool = True, arrays: bool = False) -> None:
        self.ctx = ctx
        self.cost_model = cost_model
        self.arrays = arrays  # values may stay numpy arrays (a loop), else every value is elements
        self.limit = LOOP_ELEMENTS if arrays else MAX_ELEMENTS
        self.constants: set[str] = set()  # the globals holding constant arrays
        self.kernels_bound: dict[int, str] = {}  # id(instruction) -> the global of its kernel
        self.module = ctx.module
        self.lines: list[str] = []
        self.depth = 1
        self.env: dict[str, Any] = {"_array": np.array, "_f": array("f", [0.0]), "_sqrt": math.sqrt,
                                    "_nan": DEFAULT_NAN, "_inf": math.inf, "_divide_by_zero": divide_by_zero,
                                    "_interp": ctx, "_signaling": element_ops.signaling,
                                    "_SignalingNaN": element_ops.SignalingNaN,
                                    "_sum": sum, "_check_f32": _check_f32}
        for code in BITCAST.values():
            self.env[f"_pack_{code}"] = struct.Struct("<" + code).pack
            self.env[f"_unpack_{code}"] = struct.Struct("<" + code).unpack
        self.names = itertools.count()
        self.variables: set[str] = set()  # the texts that are variables (not literals)
        self.cse: list[dict[str, str]] = [{}]  # expression -> its variable, per loop body being written
        self.rounding = array("f", [0.0])
        self.numpy_calls = 0.0
        self.statements = 0
        self.kernels = 0
        self.conversions = 0  # arrays unpacked to elements or packed from them, inside the code
        self.array_calls = 0  # kernels called on arrays that stay arrays

    def elemental(self, shape: Shape) -> bool:
        return _elemental(shape, self.limit)

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def global_(self, value: Any) -> str:
        name = f"_g{len(self.env)}"
        self.env[name] = value
        return name

    # -- entry and exit ----------------------------------------------------------------------------
    def unpack(self, name: str, shape: Shape, constants: dict[int, Instruction] | None = None) -> Value:
        """The elements of argument `name` (an array, or a tuple of them) as fresh variables; in a loop,
        an array that is not small stays one. `constants`: tuple elements known to be those constants."""
        if shape.is_tuple:
            return tuple(self.constant(constants[k]) if constants and k in constants else self.unpack(f"{name}[{k}]", s)
                         for k, s in enumerate(shape.tuple_shapes))
        if not self.elemental(shape):
            if not (self.arrays and shape.is_array):
                raise _Refused
            var = f"e{next(self.names)}"
            self.line(f"{var} = {name}")
            return _Array(var, shape)
        elems = [f"e{next(self.names)}" for _ in range(shape.numel)]
        self.variables.update(elems)
        self.line(f"{', '.join(elems)}, = {name}.reshape(-1).tolist()")
        if shape.element_type is P.F32:  # a NaN among them (rare) is looked at closer: see `_check_f32`
            self.line(f"if (_s := _sum(({', '.join(elems)},))) != _s: _check_f32({name})")
        return elems

    def elements_of(self, value: Value, shape: Shape) -> list[str]:
        """`value` as elements: an array read into Python numbers once per trip."""
        if isinstance(value, list):
            return value
        if not isinstance(value, _Array) or not self.elemental(shape):
            raise _Refused
        name = self.made(value)
        key = f"unpack {name}"
        for layer in reversed(self.cse):
            if key in layer:
                return layer[key]  # type: ignore[return-value]
        elems = [f"v{next(self.names)}" for _ in range(shape.numel)]
        self.variables.update(elems)
        self.line(f"{', '.join(elems)}, = {name}.reshape(-1).tolist()")
        if shape.element_type is P.F32:  # as `unpack`: a signaling NaN's bits go back to the numpy kernels
            self.line(f"if (_s := _sum(({', '.join(elems)},))) != _s: _check_f32({name})")
        self.conversions += 1
        self.cse[-1][key] = elems  # type: ignore[assignment]
        return elems

    def bound(self, inst: Instruction, shapes: list[Shape]) -> str:
        """The global holding `inst`'s kernel, bound once however many unrolled trips call it (a kernel
        may keep state of its own between calls)."""
        name = self.kernels_bound.get(id(inst))
        if name is None:
            name = self.kernels_bound[id(inst)] = self.global_(lookup(inst)(inst, WithOperandShapes(self.ctx, shapes)))
        return name

    def made(self, value: _Array) -> str:
        """The variable of `value`'s array, a pending broadcast made (once per trip) first."""
        if value.broadcast is None:
            return value.name
        key = f"broadcast {value.name}"
        for layer in reversed(self.cse):
            if key in layer:
                return layer[key]
        operand, fn = value.broadcast
        var = f"v{next(self.names)}"
        self.line(f"{var} = {fn}({operand})")
        self.array_calls += 1
        self.cse[-1][key] = var
        return var

    def reads_variables(self, text: str) -> bool:
        """Whether an element's text reads a variable of the code (else it is a literal)."""
        return any(name in self.variables for name in _NAME.findall(text))

    def array_of(self, value: Value, shape: Shape) -> str:
        """The text of `value` as a numpy array: elements of literals are a constant made now."""
        if isinstance(value, _Array):
            return self.made(value)
        if not isinstance(value, list):
            raise _Refused
        if not any(e in self.variables for e in value):
            constant = np.array([eval(e, self.env) for e in value], shape.dtype).reshape(shape.dimensions)  # noqa: S307
            constant.flags.writeable = False
            name = self.global_(constant)
            self.constants.add(name)
            return name
        var = f"v{next(self.names)}"
        self.line(f"{var} = {self.pack(shape, value)}")
        self.conversions += 1
        return var

    def pack(self, shape: Shape, value: Value) -> str:
        if shape.is_tuple:
            assert isinstance(value, tuple)
            return f"({''.join(self.pack(s, v) + ', ' for s, v in zip(shape.tuple_shapes, value))})"
        if isinstance(value, _Array):
            return self.made(value)
        assert isinstance(value, list)
        dtype = self.global_(shape.dtype)
        if not shape.dimensions:
            return f"_array({value[0]}, {dtype})"
        listed = f"_array([{', '.join(value)}], {dtype})"
        return listed if shape.rank == 1 else f"{listed}.reshape({tuple(shape.dimensions)})"

    def finish(self, args: list[str], shape: Shape, result: Value, conversions: int, name: str) -> Callable[..., Any]:
        self.line(f"return {self.pack(shape, result)}")
        python_cost = (self.statements * ELEMENT_COST + self.conversions * CONVERSION_COST + self.kernels * KERNEL_COST
                       + self.array_calls)
        numpy_cost = self.numpy_calls
        if self.arrays:  # a loop: its entry and exit once, against the interpreter's calls every trip
            numpy_cost += LOOP_TRIP_COST
        else:
            python_cost += (conversions + len(_leaves(shape))) * CONVERSION_COST
        if (self.cost_model and python_cost >= numpy_cost) or self.statements > MAX_STATEMENTS:
            raise _Refused
        # An f32 signaling NaN, which Python floats cannot carry, runs the whole call on the numpy
        # kernels (`run.plain`: the bound computation or loop the caller set).
        text = (f"def run({', '.join(args)}):\n    try:\n" + "\n".join("    " + line for line in self.lines)
                + f"\n    except _SignalingNaN:\n        return run.plain({', '.join(args)})\n")
        self.text = text
        exec(compile(text, f"<elements {name}>", "exec"), self.env)  # noqa: S102
        return self.env["run"]

    # -- computations ------------------------------------------------------------------------------
    def computation(self, comp: Computation, args: list[Value]) -> Value:
        values: dict[str, Value] = {}
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                values[inst.name] = args[inst.attrs["parameter_number"]]
            else:
                values[inst.name] = self.instruction(inst, comp, [values[o] for o in inst.operands])
        return values[comp.root]

    def instruction(self, inst: Instruction, comp: Computation, ins: list[Value]) -> Value:
        op = inst.opcode
        if op == "tuple":
            return tuple(ins)
        if op == "get-tuple-element":
            value = ins[0]
            assert isinstance(value, tuple)
            return value[inst.attrs["index"]]
        if op in ("fusion", "call"):
            return self.computation(self.module.computation(inst.called_computations()[0]), ins)
        if op == "while":
            return self.loop(inst, ins[0])
        small = self.elemental(inst.shape)
        if not small and not (self.arrays and inst.shape.is_array):
            raise _Refused
        if op == "constant" and small:
            return self.constant(inst)
        operands = [comp.instruction(o) for o in inst.operands]
        record = opcode_record(op)
        if record is None:
            raise _Refused
        if small and op in _LAYOUT and all(isinstance(v, list) for v in ins):
            self.numpy_calls += LAYOUT_CALL
            return layout(inst, operands, ins, self.literal)  # type: ignore[arg-type]
        if not small or record.family not in _FALLBACK_FAMILIES:
            return self.array_kernel(inst, operands, ins, record.family)
        types = [o.shape.element_type for o in operands]
        write = writer(inst, types)
        if write is None and self.arrays:
            return self.array_kernel(inst, operands, ins, record.family)  # no Python form: stays an array
        self.numpy_calls += 1
        arrays = [self.elements_of(v, o.shape) for v, o in zip(ins, operands)]
        out = [f"v{next(self.names)}" for _ in range(inst.shape.numel)]
        if write is None:
            self.kernel(inst, operands, arrays, out)
            return out
        rounded = inst.shape.element_type is P.F32 and rounds(op, types)
        for j in range(len(out)):
            operand_texts = [e[j] if len(e) > 1 else e[0] for e in arrays]
            out[j] = self.element(write(operand_texts), rounded, operand_texts, out[j])
        return out

    def array_kernel(self, inst: Instruction, operands: list[Instruction], ins: list[Value], family: str) -> _Array:
        """`inst`'s own numpy kernel on arrays (a loop's values that are not small, or ops without a
        Python form): its result stays an array."""
        if not self.arrays or family not in _ARRAY_FAMILIES or any(isinstance(v, tuple) for v in ins):
            raise _Refused
        if inst.opcode == "dynamic-update-slice" and operands[0].shape.numel > MAX_COPIED:
            raise _Refused
        shapes = [o.shape for o in operands]
        fn = self.bound(inst, shapes)
        self.numpy_calls += 1
        self.array_calls += 1
        if inst.opcode == "constant":
            name = self.global_(self.env[fn]())  # its one frozen value
            self.constants.add(name)
            return _Array(name, inst.shape)
        kernel = self.env[fn]
        if (isinstance(kernel, np.ufunc) and kernel.nout == 1 and kernel.nin == len(ins)
                and any(isinstance(v, _Array) and v.broadcast is not None for v in ins)
                and any(s.dimensions == inst.shape.dimensions and not (isinstance(v, _Array) and v.broadcast)
                        for v, s in zip(ins, shapes))):
            # numpy's broadcasting reads a pending broadcast's operand as the broadcast would be read.
            args = [v.name if isinstance(v, _Array) and v.broadcast else self.array_of(v, s)
                    for v, s in zip(ins, shapes)]
        else:
            starts = _SLICE_STARTS.get(inst.opcode)
            if not (starts is not None and len(shapes) - starts == shapes[0].rank
                    and all(s.rank == 0 and s.dtype.kind in "iu" for s in shapes[starts:])):
                starts = len(ins)
            # The scalar-starts kernels read each start with int(): a start held as a Python int goes
            # as it is, not as a 0-d array made every trip (a literal start stays a constant array).
            args = [f"({v[0]})" if k >= starts and isinstance(v, list) and self.reads_variables(v[0])
                    else self.array_of(v, s) for k, (v, s) in enumerate(zip(ins, shapes))]
        if inst.opcode == "broadcast" and args[0] not in self.constants:
            dims = list(inst.attrs.get("dimensions") or [])
            if dims == sorted(dims):  # made only if a reader needs it whole (`made`)
                self.array_calls -= 1
                expanded = [1] * inst.shape.rank
                for i, d in enumerate(dims):
                    expanded[d] = shapes[0].dimensions[i]
                var = f"v{next(self.names)}"
                self.line(f"{var} = {args[0]}.reshape({tuple(expanded)})")
                return _Array(var, inst.shape, (args[0], fn))
        if all(a in self.constants for a in args):  # constant operands: computed now, once
            self.numpy_calls -= 1
            self.array_calls -= 1
            with np.errstate(all="ignore"):
                value = np.asarray(self.env[fn](*[self.env[a] for a in args]))
            value.flags.writeable = False
            name = self.global_(value)
            self.constants.add(name)
            return _Array(name, inst.shape)
        if getattr(kernel, "passes_through", False):  # a copy: values are never written
            self.numpy_calls -= 1
            self.array_calls -= 1
            return _Array(args[0], inst.shape)
        var = f"v{next(self.names)}"
        reshaped = getattr(kernel, "reshaped_to", None)
        self.line(f"{var} = {args[0]}.reshape({reshaped})" if reshaped is not None else
                  f"{var} = {fn}({', '.join(args)})")
        return _Array(var, inst.shape)

    def element(self, text: str, rounded: bool, operands: list[str], var: str) -> str:
        """The text naming one element's value: a literal when its operands are (folded now), the
        variable of the same expression computed before in this trip (`cse`), or `var`, assigned."""
        if not any(o in self.variables for o in operands):
            value = eval(text, self.env)  # noqa: S307  (our own text of literals)
            if rounded:
                self.rounding[0] = value
                value = self.rounding[0]
            return self.literal(value)
        if text in self.variables:
            return text  # an identity (x + 0)
        key = ("f32 " if rounded else "") + text
        for layer in reversed(self.cse):
            if key in layer:
                return layer[key]
        self.line(f"_f[0] = {text}; {var} = _f[0]" if rounded else f"{var} = {text}")
        self.statements += 2 if rounded else 1
        self.variables.add(var)
        self.cse[-1][key] = var
        return var

    def loop(self, inst: Instruction, state: Value) -> Value:
        """The While `inst` from `state`: unrolled when its condition folds to a literal every trip
        (a counted loop of constant bounds, `MAX_UNROLLED` trips at most), else a Python `while`
        whose variables are the state's elements."""
        condition = self.module.computation(inst.attrs["condition"])
        body = self.module.computation(inst.attrs["body"])
        saved = self.snapshot()
        self.rolled(inst, condition, body, state)
        per_trip = self.cost_since(saved)
        self.restore(saved)
        unrolled = self.unrolled(condition, body, state)
        if unrolled is not None:
            value, trips = unrolled
            # Kept when writing the trips out folds work (constants known per trip), not for the
            # loop's own bookkeeping alone: long straight code of numpy calls runs no faster.
            if self.cost_since(saved) <= UNROLL_GAIN * per_trip * max(trips, 1):
                return value
            self.restore(saved)
        return self.rolled(inst, condition, body, state)

    def rolled(self, inst: Instruction, condition: Computation, body: Computation, state: Value) -> Value:
        """The loop as a Python `while` whose variables are the state's elements (or arrays)."""
        leaves = _leaves(inst.shape)
        entry = [self.kept_as(v, shape) for v, shape in zip(_leaf_values(state), leaves)]
        variables = [[f"s{next(self.names)}" for _ in v] if isinstance(v, list) else f"s{next(self.names)}"
                     for v in entry]
        flat_vars = [n for v in variables for n in (v if isinstance(v, list) else [v])]
        flat_entry = [t for v in entry for t in (v if isinstance(v, list) else [v])]
        self.variables.update(n for v in variables if isinstance(v, list) for n in v)
        self.line(f"{', '.join(flat_vars)}, = {', '.join(flat_entry)},")
        current = _rebuild(state, iter([v if isinstance(v, list) else _Array(v, shape)
                                        for v, shape in zip(variables, leaves)]))
        self.line("while True:")
        self.depth += 1
        self.cse.append({})
        self.line("if _interp.mailbox is not None and _interp.mailbox.aborted is not None: "
                  "raise _interp.mailbox.aborted")
        (go,) = self.elements_of(self.computation(condition, [current]), condition.root_instruction.shape)
        self.line(f"if not {go}: break")
        following = [self.kept_as(v, shape) for v, shape in zip(_leaf_values(self.computation(body, [current])),
                                                                 leaves)]
        flat_following = [t for v in following for t in (v if isinstance(v, list) else [v])]
        self.line(f"{', '.join(flat_vars)}, = {', '.join(flat_following)},")
        self.cse.pop()
        self.depth -= 1
        return current

    def kept_as(self, value: Value, shape: Shape) -> list[str] | str:
        """A state element as the loop keeps it: its elements when small, else an array's text."""
        if self.elemental(shape):
            return self.elements_of(value, shape)
        return self.array_of(value, shape)

    def unrolled(self, condition: Computation, body: Computation, state: Value) -> tuple[Value, int] | None:
        """The loop's trips written one after the other and their count, or None (nothing written)
        when its condition does not fold, or it runs too many trips or statements."""
        saved = self.snapshot()
        current = state
        for trips in range(MAX_UNROLLED + 1):
            verdict = self.computation(condition, [current])
            if not isinstance(verdict, list) or verdict[0] in self.variables:
                break  # decided at run time
            if (self.statements - saved[2] > MAX_UNROLLED_STATEMENTS
                    or self.array_calls - saved[5] > MAX_UNROLLED_CALLS):
                break
            if not eval(verdict[0], self.env):  # noqa: S307  (a literal)
                return current, trips
            current = self.computation(body, [current])
        self.restore(saved)
        return None

    def snapshot(self) -> tuple:
        return (len(self.lines), self.numpy_calls, self.statements, self.kernels, self.conversions,
                self.array_calls, [dict(c) for c in self.cse])

    def restore(self, saved: tuple) -> None:
        """Forget what was written since `saved` (a `snapshot`)."""
        del self.lines[saved[0]:]
        (self.numpy_calls, self.statements, self.kernels, self.conversions, self.array_calls,
         self.cse) = saved[1:]

    def cost_since(self, saved: tuple) -> float:
        """What the code written since `saved` costs to run once, in numpy calls."""
        return ((self.statements - saved[2]) * ELEMENT_COST + (self.kernels - saved[3]) * KERNEL_COST
                + (self.conversions - saved[4]) * CONVERSION_COST + self.array_calls - saved[5])

    def constant(self, inst: Instruction) -> list[str]:
        literal = inst.attrs.get("literal")
        if literal is None:
            raise _Refused
        values = np.asarray(literal).astype(inst.shape.dtype)
        if inst.shape.element_type is P.F32 and element_ops.has_signaling_f32(values):
            raise _Refused  # its bits would not survive a Python float
        return [self.literal(v) for v in values.reshape(-1).tolist()]

    def literal(self, v: Any) -> str:
        if isinstance(v, float) and not math.isfinite(v):
            return self.global_(v) if math.isnan(v) else "_inf" if v > 0 else "(-_inf)"  # a NaN keeps its bits
        return repr(v)

    def kernel(self, inst: Instruction, operands: list[Instruction], ins: list[list[str]], out: list[str]) -> None:
        """An op without a Python form: its numpy kernel on arrays of the elements."""
        shapes = [o.shape for o in operands]
        fn = self.global_(lookup(inst)(inst, WithOperandShapes(self.ctx, shapes)))
        args = [f"_array([{', '.join(elems)}], {self.global_(s.dtype)}).reshape({tuple(s.dimensions)})"
                for s, elems in zip(shapes, ins)]
        self.line(f"{', '.join(out)}, = {fn}({', '.join(args)}).reshape(-1).tolist()")
        self.variables.update(out)
        self.kernels += 1


def _check_f32(a: np.ndarray) -> None:
    """Raise SignalingNaN if the f32 array `a` holds a signaling NaN."""
    if element_ops.has_signaling_f32(a):
        raise element_ops.SignalingNaN


def _leaf_values(value: Value) -> list[Value]:
    """The arrays of a (nested) tuple value, in order."""
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in _leaf_values(v)]
    return [value]


def _rebuild(value: Value, leaves: Any) -> Value:
    """`value`'s tuple structure over the next of `leaves`."""
    if isinstance(value, tuple):
        return tuple(_rebuild(v, leaves) for v in value)
    return next(leaves)
