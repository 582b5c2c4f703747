"""A translated loop's trips (`machine.text`) as LLVM IR, compiled by llvmlite.

numba compiled the same function too, but its typing and lowering of every op cost many times what
LLVM itself needs (bench/LOG-2026.md). `compile_trips` reads the `trips` function
`machine.text` writes (a small subset of Python:
int64, double and bool variables, arithmetic, compares, conditional expressions, named operations'
calls, fixed-size scratch arrays for numpy's inner loops) and emits it as one LLVM function
`i64 trips(i64 *ints, double *doubles, i64 budget)`: the state's integers and bools in `ints`, its
floats in `doubles`, read on entry and written back before it returns 0 (budget spent), 1 (the loop
ended) or 2 (a signaling NaN: the call runs on the numpy kernels). Each construct has the Python code's bits:
int64 arithmetic under the same masks, doubles, f32 rounding as a C float's (fptrunc), bitcasts as
struct's, a conditional expression's untaken side never run. Anything else raises `Unsupported`.
"""

from __future__ import annotations

import ast
import ctypes
import itertools
import re
import struct
from typing import Any

import llvmlite.binding as llvm
from llvmlite import ir

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
_DTYPES = {"float32": F32, "float64": F64, "bool": I8, "bool_": I8, "int8": I8, "int16": ir.IntType(16), "int32": I32,
           "int64": I64, "uint8": I8, "uint16": ir.IntType(16), "uint32": I32}
_COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_FLOAT_COMPARE = {"<": "olt", "<=": "ole", ">": "ogt", ">=": "oge", "==": "oeq", "!=": "une"}
PAUSED, DONE, SIGNALING = 0, 1, 2

_engine: Any = None
_target: Any = None
_count = itertools.count()  # each module's function has a name of its own in the one engine


class Unsupported(Exception):
    """The function has something this emitter does not write."""


def _init() -> None:
    global _engine, _target
    if _engine is None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        _target = llvm.Target.from_default_triple().create_target_machine(opt=2)
        _engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _target)


def compile_trips(source: str, kinds: list[str], loops: list[tuple[int, int]]) -> Any:
    """The machine code of `source`'s `trips` for a state of `kinds` ("i" int, "f" float, "b" bool):
    a ctypes function (ints, doubles, budget) -> status. `loops`: numpy loops' (function, data)."""
    module = ast.parse(source)
    constants = _constants(module)
    (fn,) = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "trips"]
    name = f"trips_{next(_count)}"
    text = str(_Emitter(fn, constants, kinds, loops, name).module)
    _init()
    parsed = llvm.parse_assembly(text)
    parsed.verify()
    tuning = llvm.create_pipeline_tuning_options(2)
    builder = llvm.create_pass_builder(_target, tuning)
    builder.getModulePassManager().run(parsed, builder)
    _engine.add_module(parsed)
    _engine.finalize_object()
    address = _engine.get_function_address(name)
    return ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(address)


def _constants(module: ast.Module) -> dict[str, float]:
    """The module's float constants (`_nan`, `_inf`, `_gN`), exactly as `machine.text` writes them."""
    found = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = ast.unparse(node.value)
            m = re.fullmatch(r"np\.int64\((-?\d+)\)\.view\(np\.float64\)", text)
            if m:
                found[node.targets[0].id] = struct.unpack("<d", struct.pack("<q", int(m[1])))[0]
            elif text == "math.inf":
                found[node.targets[0].id] = float("inf")
            elif isinstance(node.value, ast.Constant | ast.UnaryOp):
                found[node.targets[0].id] = float(ast.literal_eval(node.value))
    return found


class _Emitter:
    def __init__(self, fn: ast.FunctionDef, constants: dict[str, float], kinds: list[str],
                 loops: list[tuple[int, int]], name: str) -> None:
        self.module = ir.Module(name=name)
        self.module.triple = llvm.get_process_triple()
        self.constants = constants
        self.loops = loops
        func = ir.Function(self.module, ir.FunctionType(I64, [I64.as_pointer(), F64.as_pointer(), I64]), name)
        ints, doubles, budget = func.args
        self.func = func
        self.slots = ir.IRBuilder(func.append_basic_block("slots"))  # every variable's slot, first
        entry = func.append_basic_block("entry")
        self.b = ir.IRBuilder(entry)
        self.vars: dict[str, tuple[Any, Any]] = {}  # name -> (slot, type)
        self.arrays: dict[str, tuple[Any, Any, int, str]] = {}  # name -> (slot, element type, length, dtype)
        params = [a.arg for a in fn.args.args]
        state, names = params[:len(kinds)], params[len(kinds):]
        if names[:1] != ["_budget"] or len(names) != 1 + 2 * len(loops):
            raise Unsupported
        self.state = list(zip(state, kinds))
        counters = {"i": 0, "f": 0}
        self.places = []
        for name, kind in self.state:
            base, index = (doubles, counters["f"]) if kind == "f" else (ints, counters["i"])
            counters["f" if kind == "f" else "i"] += 1
            pointer = self.b.gep(base, [ir.Constant(I64, index)])
            self.places.append((pointer, kind))
            value = self.b.load(pointer)
            typ = F64 if kind == "f" else I1 if kind == "b" else I64
            self.assign(name, self.b.icmp_unsigned("!=", value, ir.Constant(I64, 0)) if kind == "b" else value, typ)
        self.budget = budget
        self.signal_block = func.append_basic_block("signaling")
        ir.IRBuilder(self.signal_block).ret(ir.Constant(I64, SIGNALING))
        self.statements(fn.body)
        if not self.b.block.is_terminated:
            raise Unsupported
        self.slots.branch(entry)

    # -- variables and state -----------------------------------------------------------------------
    def slot(self, name: str, typ: Any) -> Any:
        """A variable's stack slot, in the function's first block (LLVM makes registers of them)."""
        return self.slots.alloca(typ, name=name)

    def assign(self, name: str, value: Any, typ: Any) -> None:
        if name not in self.vars:
            self.vars[name] = (self.slot(name, typ), typ)
        slot, want = self.vars[name]
        self.b.store(self.convert(value, typ, want), slot)

    def load(self, name: str) -> tuple[Any, Any]:
        if name in self.vars:
            slot, typ = self.vars[name]
            return self.b.load(slot), typ
        if name in self.constants:
            return ir.Constant(F64, self.constants[name]), F64
        raise Unsupported(name)

    def leave(self, status: int) -> None:
        """Write the state back and return `status`."""
        for (name, kind), (pointer, _) in zip(self.state, self.places):
            value, typ = self.load(name)
            self.b.store(self.convert(value, typ, F64 if kind == "f" else I64), pointer)
        self.b.ret(ir.Constant(I64, status))

    def convert(self, value: Any, typ: Any, want: Any) -> Any:
        if typ == want:
            return value
        if typ == I1 and want == I64:
            return self.b.zext(value, I64)
        if typ == I1 and want == F64:
            return self.b.uitofp(value, F64)
        if typ == I64 and want == F64:
            return self.b.sitofp(value, F64)
        if want == I1:
            return self.truth(value, typ)
        raise Unsupported(f"{typ} -> {want}")

    def truth(self, value: Any, typ: Any) -> Any:
        if typ == I1:
            return value
        if typ == F64:
            return self.b.fcmp_unordered("!=", value, ir.Constant(F64, 0.0))
        return self.b.icmp_signed("!=", value, ir.Constant(typ, 0))

    # -- statements --------------------------------------------------------------------------------
    def statements(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if self.b.block.is_terminated:
                raise Unsupported("code after a jump")
            self.statement(stmt)

    def statement(self, s: ast.stmt) -> None:
        text = ast.unparse(s)
        if text == "_scratch = np.empty(8, np.intp)":
            return
        if text == "_n = 0":
            self.assign("_n", ir.Constant(I64, 0), I64)
            return
        if text == "_n += 1":
            n, _ = self.load("_n")
            self.assign("_n", self.b.add(n, ir.Constant(I64, 1)), I64)
            return
        if isinstance(s, ast.While) and ast.unparse(s.test) == "True" and not s.orelse:
            self.loop(s.body)
            return
        if isinstance(s, ast.Return) and isinstance(s.value, ast.Tuple):
            flag = s.value.elts[0]
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                raise Unsupported
            self.leave(DONE)
            return
        if isinstance(s, ast.If) and not s.orelse and len(s.body) == 1:
            if ast.unparse(s.test) == "_n == _budget" and isinstance(s.body[0], ast.Return):
                n, _ = self.load("_n")
                spent = self.b.icmp_signed("==", n, self.budget)
                with self.b.if_then(spent):
                    self.leave(PAUSED)
                return
            if isinstance(s.body[0], ast.Break):
                self.branch_out(self.truth(*self.expression(s.test)))
                return
        if isinstance(s, ast.Assign) and len(s.targets) == 1:
            self.assignment(s.targets[0], s.value)
            return
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Name):
            self.procedure(s.value.func.id, s.value.args)
            return
        raise Unsupported(text)

    def loop(self, body: list[ast.stmt]) -> None:
        head = self.func.append_basic_block("trip")
        after = self.func.append_basic_block("after")
        self.b.branch(head)
        self.b.position_at_end(head)
        saved, self.exit = getattr(self, "exit", None), after
        self.statements(body)
        if not self.b.block.is_terminated:
            self.b.branch(head)
        self.exit = saved
        self.b.position_at_end(after)

    def branch_out(self, condition: Any) -> None:
        go_on = self.func.append_basic_block("go_on")
        self.b.cbranch(condition, self.exit, go_on)
        self.b.position_at_end(go_on)

    def assignment(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            if isinstance(value, ast.Call) and ast.unparse(value.func) == "np.empty":
                self.array(target.id, value)
                return
            v, typ = self.expression(value)
            self.assign(target.id, v, typ)
            return
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            values = [self.expression(v) for v in value.elts]  # all read before any is written
            for t, (v, typ) in zip(target.elts, values):
                if not isinstance(t, ast.Name):
                    raise Unsupported
                self.assign(t.id, v, self.vars[t.id][1] if t.id in self.vars else typ)
            return
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            pointer, element, dtype = self.element(target)
            v, typ = self.expression(value)
            if element in (F32, F64):
                if typ != F64:
                    raise Unsupported
                self.b.store(self.b.fptrunc(v, F32) if element == F32 else v, pointer)
            elif typ in (I64, I1):
                self.b.store(self.b.zext(v, element) if typ == I1 else self.b.trunc(v, element)
                             if element != I64 else v, pointer)
            else:
                raise Unsupported
            return
        raise Unsupported(ast.unparse(target))

    def array(self, name: str, call: ast.Call) -> None:
        size, dtype = call.args
        if not isinstance(size, ast.Constant) or not isinstance(dtype, ast.Attribute) or dtype.attr not in _DTYPES:
            raise Unsupported
        element = _DTYPES[dtype.attr]
        self.arrays[name] = (self.slot(name, ir.ArrayType(element, size.value)), element, size.value, dtype.attr)

    def element(self, node: ast.Subscript) -> tuple[Any, Any, str]:
        name = node.value.id  # type: ignore[attr-defined]
        if name not in self.arrays or not isinstance(node.slice, ast.Constant):
            raise Unsupported
        slot, element, _, dtype = self.arrays[name]
        return self.b.gep(slot, [ir.Constant(I32, 0), ir.Constant(I32, node.slice.value)]), element, dtype

    def procedure(self, name: str, args: list[ast.expr]) -> None:
        if name == "check_f32":
            slot, element, size, _ = self.arrays[args[0].id]  # type: ignore[attr-defined]
            if element != F32:
                raise Unsupported
            for k in range(size):
                bits = self.b.bitcast(self.b.load(self.b.gep(slot, [ir.Constant(I32, 0), ir.Constant(I32, k)])), I32)
                self.signal_if(self.signaling_bits(bits))
            return
        if name in ("call1", "call2"):
            fn_name = args[0].id  # type: ignore[attr-defined]
            k = int(fn_name[2:])
            function, data = self.loops[k]
            arrays = [self.arrays[a.id] for a in args[2:-1]]  # type: ignore[attr-defined]
            pointer = I8.as_pointer()
            pointers = self.slot("args", ir.ArrayType(pointer, len(arrays)))
            steps = self.slot("steps", ir.ArrayType(I64, len(arrays)))
            dims = self.slot("dims", I64)
            for j, (slot, element, _size, _) in enumerate(arrays):
                self.b.store(self.b.bitcast(slot, pointer), self.b.gep(pointers, [ir.Constant(I32, 0),
                                                                                  ir.Constant(I32, j)]))
                self.b.store(ir.Constant(I64, _width(element)), self.b.gep(steps, [ir.Constant(I32, 0),
                                                                                   ir.Constant(I32, j)]))
            self.b.store(ir.Constant(I64, arrays[-1][2]), dims)
            kind = ir.FunctionType(ir.VoidType(), [pointer.as_pointer(), I64.as_pointer(), I64.as_pointer(), pointer])
            callee = self.b.inttoptr(ir.Constant(I64, function), kind.as_pointer())
            self.b.call(callee, [self.b.bitcast(pointers, pointer.as_pointer()), dims,
                                 self.b.bitcast(steps, I64.as_pointer()),
                                 self.b.inttoptr(ir.Constant(I64, data), pointer)])
            return
        raise Unsupported(name)

    def signaling_bits(self, bits: Any) -> Any:
        exponent = self.b.icmp_unsigned("==", self.b.and_(bits, ir.Constant(I32, 0x7FC00000)),
                                        ir.Constant(I32, 0x7F800000))
        payload = self.b.icmp_unsigned("!=", self.b.and_(bits, ir.Constant(I32, 0x3FFFFF)), ir.Constant(I32, 0))
        return self.b.and_(exponent, payload)

    def signal_if(self, condition: Any) -> None:
        go_on = self.func.append_basic_block("quiet")
        self.b.cbranch(condition, self.signal_block, go_on)
        self.b.position_at_end(go_on)

    # -- expressions -------------------------------------------------------------------------------
    def expression(self, e: ast.expr) -> tuple[Any, Any]:
        b = self.b
        if isinstance(e, ast.Constant):
            if isinstance(e.value, bool):
                return ir.Constant(I1, int(e.value)), I1
            if isinstance(e.value, int):
                if not -(1 << 63) <= e.value < (1 << 63):
                    raise Unsupported
                return ir.Constant(I64, e.value), I64
            if isinstance(e.value, float):
                return ir.Constant(F64, e.value), F64
            raise Unsupported
        if isinstance(e, ast.Name):
            return self.load(e.id)
        if isinstance(e, ast.Attribute) and ast.unparse(e) == "math.inf":
            return ir.Constant(F64, float("inf")), F64
        if isinstance(e, ast.UnaryOp):
            v, typ = self.expression(e.operand)
            if isinstance(e.op, ast.Not):
                return b.not_(self.truth(v, typ)), I1
            if isinstance(e.op, ast.USub):
                if typ == F64:
                    return b.fneg(v), F64
                v = self.convert(v, typ, I64)
                return b.sub(ir.Constant(I64, 0), v), I64
            if isinstance(e.op, ast.Invert):
                return b.xor(self.convert(v, typ, I64), ir.Constant(I64, -1)), I64
            raise Unsupported
        if isinstance(e, ast.BinOp):
            return self.binary(e)
        if isinstance(e, ast.Compare):
            return self.compare(e)
        if isinstance(e, ast.IfExp):
            return self.choice(e.test, e.body, e.orelse)
        if isinstance(e, ast.BoolOp):
            return self.boolean(e)
        if isinstance(e, ast.Call):
            return self.call(e)
        raise Unsupported(ast.unparse(e))

    def binary(self, e: ast.BinOp) -> tuple[Any, Any]:
        b = self.b
        left, lt = self.expression(e.left)
        right, rt = self.expression(e.right)
        op = type(e.op)
        if op in (ast.BitAnd, ast.BitOr, ast.BitXor):
            if F64 in (lt, rt):
                raise Unsupported
            typ = I1 if lt == rt == I1 else I64
            left, right = self.convert(left, lt, typ), self.convert(right, rt, typ)
            return {ast.BitAnd: b.and_, ast.BitOr: b.or_, ast.BitXor: b.xor}[op](left, right), typ
        if op in (ast.LShift, ast.RShift):
            left, right = self.convert(left, lt, I64), self.convert(right, rt, I64)
            return (b.shl(left, right) if op is ast.LShift else b.ashr(left, right)), I64
        if op is ast.Div or F64 in (lt, rt):
            left, right = self.convert(left, lt, F64), self.convert(right, rt, F64)
            ops = {ast.Add: b.fadd, ast.Sub: b.fsub, ast.Mult: b.fmul, ast.Div: b.fdiv}
            if op not in ops:
                raise Unsupported
            return ops[op](left, right), F64
        left, right = self.convert(left, lt, I64), self.convert(right, rt, I64)
        ops = {ast.Add: b.add, ast.Sub: b.sub, ast.Mult: b.mul}
        if op not in ops:
            raise Unsupported
        return ops[op](left, right), I64

    def compare(self, e: ast.Compare) -> tuple[Any, Any]:
        result = None
        left, lt = self.expression(e.left)
        for op, node in zip(e.ops, e.comparators):  # a chain: each compare of the same middle value
            right, rt = self.expression(node)
            symbol = _COMPARE[type(op)]
            if F64 in (lt, rt):
                one = self.b.fcmp_unordered(symbol, self.convert(left, lt, F64), self.convert(right, rt, F64)) \
                    if symbol == "!=" else self.b.fcmp_ordered(symbol, self.convert(left, lt, F64),
                                                               self.convert(right, rt, F64))
            else:
                one = self.b.icmp_signed(symbol, self.convert(left, lt, I64), self.convert(right, rt, I64))
            result = one if result is None else self.b.and_(result, one)
            left, lt = right, rt
        return result, I1

    def choice(self, test: ast.expr, body: ast.expr, orelse: ast.expr) -> tuple[Any, Any]:
        """`body if test else orelse` with branches: only the side taken runs (a guarded shift, a
        signaling NaN)."""
        condition = self.truth(*self.expression(test))
        yes, no, join = (self.func.append_basic_block(n) for n in ("yes", "no", "join"))
        self.b.cbranch(condition, yes, no)
        results = []
        for block, node in ((yes, body), (no, orelse)):
            self.b.position_at_end(block)
            v, typ = self.expression(node)
            results.append((v, typ, self.b.block))
        types = [t for _, t, _ in results if t is not None]
        typ = F64 if F64 in types else I64 if I64 in types else I1
        converted = []
        for v, t, block in results:
            self.b.position_at_end(block)
            if not block.is_terminated:
                converted.append((self.convert(v, t, typ), self.b.block))
                self.b.branch(join)
        self.b.position_at_end(join)
        phi = self.b.phi(typ)
        for v, block in converted:
            phi.add_incoming(v, block)
        return phi, typ

    def boolean(self, e: ast.BoolOp) -> tuple[Any, Any]:
        """`or` / `and`, as a truth value (the generated code uses them in tests only)."""
        value, typ = self.expression(e.values[0])
        result = self.truth(value, typ)
        for node in e.values[1:]:
            start = self.b.block
            rest, join = self.func.append_basic_block("rest"), self.func.append_basic_block("joined")
            if isinstance(e.op, ast.Or):
                self.b.cbranch(result, join, rest)
            else:
                self.b.cbranch(result, rest, join)
            self.b.position_at_end(rest)
            other = self.truth(*self.expression(node))
            end = self.b.block
            self.b.branch(join)
            self.b.position_at_end(join)
            phi = self.b.phi(I1)
            phi.add_incoming(result, start)
            phi.add_incoming(other, end)
            result = phi
        return result, I1

    def call(self, e: ast.Call) -> tuple[Any, Any]:
        b = self.b
        name = ast.unparse(e.func)
        if name == "signaling" and not e.args:
            b.branch(self.signal_block)
            b.position_at_end(self.func.append_basic_block("unreached"))
            return ir.Constant(F64, 0.0), F64
        if len(e.args) != 1:
            raise Unsupported(name)
        arg = e.args[0]
        if name in ("float", "int", "bool") and isinstance(arg, ast.Subscript):
            pointer, element, dtype = self.element(arg)
            value = b.load(pointer)
            if name == "float":
                if element not in (F32, F64):
                    raise Unsupported
                return (b.fpext(value, F64) if element == F32 else value), F64
            if element in (F32, F64):
                raise Unsupported
            if name == "bool":
                return b.icmp_unsigned("!=", value, ir.Constant(element, 0)), I1
            if element == I64:
                return value, I64
            return (b.zext(value, I64) if dtype.startswith(("uint", "bool")) else b.sext(value, I64)), I64
        v, typ = self.expression(arg)
        if name == "r32":
            return b.fpext(b.fptrunc(self.convert(v, typ, F64), F32), F64), F64
        if name == "float":
            return self.convert(v, typ, F64), F64
        if name == "int" and typ in (I64, I1):
            return self.convert(v, typ, I64), I64
        if name == "bool":
            return self.truth(v, typ), I1
        if name == "abs":
            if typ == F64:
                return b.call(self.intrinsic("llvm.fabs.f64"), [v]), F64
            v = self.convert(v, typ, I64)
            return b.select(b.icmp_signed("<", v, ir.Constant(I64, 0)), b.sub(ir.Constant(I64, 0), v), v), I64
        if name == "math.sqrt":
            return b.call(self.intrinsic("llvm.sqrt.f64"), [self.convert(v, typ, F64)]), F64
        if name == "u32_to_f32" and typ == I64:
            return b.fpext(b.bitcast(b.trunc(v, I32), F32), F64), F64
        if name in ("f32_to_u32", "f32_to_s32") and typ == F64:
            bits = b.bitcast(b.fptrunc(v, F32), I32)
            return (b.zext(bits, I64) if name == "f32_to_u32" else b.sext(bits, I64)), I64
        if name == "s64_to_f64" and typ == I64:
            return b.bitcast(v, F64), F64
        if name == "f64_to_s64" and typ == F64:
            return b.bitcast(v, I64), I64
        raise Unsupported(name)

    def intrinsic(self, name: str) -> Any:
        found = self.module.globals.get(name)
        return found if found is not None else ir.Function(self.module, ir.FunctionType(F64, [F64]), name)


def _width(element: Any) -> int:
    return {F32: 4, F64: 8, I8: 1, I32: 4, I64: 8}.get(element, 2)
