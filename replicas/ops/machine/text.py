"""A per-element While loop's Python text (`ops.python_elements`) rewritten for machine code (`ops.machine`).

The generated Python of a loop is `def run(a0): try: <prologue> <entry> while True: <trip> return
<result>`. `translate` keeps the prologue and the result in Python (a driver, `machine.loops`) and
rewrites the trip as a function over the state's elements, `trips(state..., budget, loops...)`,
which runs at most `budget` trips and returns, so the driver checks for an abort between calls; the
LLVM emitter (`machine.emit`) compiles it. Each Python statement gets a form with the same bits:
integers below 64 bits are int64 (wrapped by the same masks), s64 wraps as int64 does, floats are
doubles rounded to f32 where the Python code rounds (`r32`), bitcasts and IEEE division are named
operations, and an op left to its numpy kernel calls numpy's own inner loop for those types
(`ufunc_loop`, checked against the ufunc). Anything else (arrays that stay arrays, nested rolled
loops, 64-bit unsigned values, kernels that are not ufuncs) is `Refused`, and the Python code runs.
"""

from __future__ import annotations

import ast
import ctypes
import hashlib
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The names a translated expression may use besides its variables.
_HELPERS = frozenset({"r32", "signaling", "u32_to_f32", "f32_to_u32", "f32_to_s32", "s64_to_f64", "f64_to_s64",
                      "divide_by_zero", "check_f32", "call1", "call2", "math", "np", "abs", "float", "int", "bool",
                      "_nan", "_inf"})
_BITCASTS = {("I", "f"): "u32_to_f32", ("i", "f"): "u32_to_f32", ("f", "I"): "f32_to_u32",
             ("f", "i"): "f32_to_s32", ("q", "d"): "s64_to_f64", ("d", "q"): "f64_to_s64"}
_VARIABLE = re.compile(r"[vse]\d+")
_ROUNDED = re.compile(r"_f\[0\] = (.*); (v\d+) = _f\[0\]$")
_PACKED = re.compile(r"(v\d+) = _array\(\[?(.*?)\]?, (_g\d+)\)(?:\.reshape\([^)]*\))?$")
_KERNEL = re.compile(r"(v\d+) = (_g\d+)\(((?:[\w]+, )*[\w]+)\)$")
_READ = re.compile(r"((?:v\d+, )+)= (v\d+)\.reshape\(-1\)\.tolist\(\)$")
_NAN_CHECK = re.compile(r"if \(_s := _sum\(\(.*\)\)\) != _s: _check_f32\((v\d+)\)$")
_BITCAST = re.compile(r"_unpack_(\w)\(_pack_(\w)\(([^()]+|\([^()]+\))\)\)\[0\]")
# IEEE division as the Python code spells it (Python raises on x / 0): the machine's division does it.
_DIVISION = re.compile(r"\((\S+) / (\S+) if \2 else _divide_by_zero\(\1, \2\)\)")
# s64 wrapping as the Python code spells it on unbounded ints: int64 arithmetic wraps by itself.
_S64_WRAP = re.compile(r"\(\(\(\(([^()]*(?:\([^()]*\))?[^()]*)\) \+ 9223372036854775808\) & 18446744073709551615\)"
                       r" - 9223372036854775808\)")
_ABORT = "if _interp.mailbox is not None and _interp.mailbox.aborted is not None: raise _interp.mailbox.aborted"
_WIDE = 1 << 62  # an integer literal this large means 64-bit wrapping, which int64 cannot do as Python ints


class Refused(Exception):
    """The loop has something without a machine form here."""


@dataclass
class Translation:
    """A loop's trips as a module (`source`, its function `trips`) and its Python driver's parts."""

    source: str
    key: str  # digest of `source`, naming its compiled code
    prologue: list[str]  # the Python lines before the loop (at their indent), ending with the entry
    state: list[str]  # the state's variables, in `trips`' argument order
    result: str  # the Python return line
    loops: list[tuple[int, int]] = field(default_factory=list)  # (function, data) addresses, after budget


def translate(text: str, env: dict[str, Any]) -> Translation:
    """`text` (the generated Python of a loop, run with globals `env`) as `trips`, or `Refused`."""
    lines = text.splitlines()
    top = "        while True:"
    if lines[:2] != ["def run(a0):", "    try:"] or lines.count(top) != 1:
        raise Refused
    start = lines.index(top)
    end = start + 1
    while lines[end].startswith("            "):
        end += 1
    if not lines[end].startswith("        return ") or lines[end + 1] != "    except _SignalingNaN:":
        raise Refused
    prologue, trip, result = lines[2:start], lines[start + 1:end], lines[end]
    entry = prologue[-1].strip()
    if not entry.startswith("s") or " = " not in entry:
        raise Refused
    state = [n.strip() for n in entry.split(" = ")[0].split(",") if n.strip()]
    elements = {n for line in prologue for n in _assigned_elements(line)}
    if not all(_VARIABLE.fullmatch(n) for n in state) or trip[0].strip() != _ABORT:
        raise Refused
    entry_values = [v.strip() for v in entry.split(" = ", 1)[1].split(",") if v.strip()]
    if any(not (v in elements or _literal(v, env)) for v in entry_values):
        raise Refused  # a state element that stays an array
    writer = _Writer(env)
    body = [writer.statement(line) for line in trip[1:]]
    names = ", ".join(state)
    loops = ", ".join(f"_p{k}, _d{k}" for k in range(len(writer.loops)))
    source = "\n".join([
        '"""A While loop\'s trips, written by replicas.ops.machine.text for replicas.ops.machine.emit."""',
        "import math", "", "import numpy as np", "",
        f"_nan = {_float_text(float(env['_nan']))}", "_inf = math.inf", *writer.constants, "", "",
        f"def trips({names}, _budget{', ' + loops if loops else ''}):",
        "    _scratch = np.empty(8, np.intp)", "    _n = 0", "    while True:",
        f"        if _n == _budget: return False, {names}", "        _n += 1",
        *[line[4:] for chunk in body for line in chunk], f"    return True, {names}", ""])
    key = hashlib.sha256(source.encode()).hexdigest()[:24]
    return Translation(source, key, prologue, state, result, writer.loops)


def _assigned_elements(line: str) -> list[str]:
    text = line.strip()
    if ".tolist()" not in text:
        return []
    return [n.strip() for n in text.split(" = ")[0].split(",") if n.strip()]


def _literal(text: str, env: dict[str, Any]) -> bool:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text in ("_inf", "(-_inf)", "_nan") or (text in env and isinstance(env[text], float))
    return isinstance(value, bool | int | float) and not (isinstance(value, int) and abs(value) >= _WIDE)


def _float_text(value: float) -> str:
    """A float literal with its exact bits (a NaN's sign and payload too)."""
    bits = struct.unpack("<q", struct.pack("<d", value))[0]
    return f"np.int64({bits}).view(np.float64)" if value != value else repr(value)


class _Writer:
    def __init__(self, env: dict[str, Any]) -> None:
        self.env = env
        self.constants: list[str] = []
        self.defined: set[str] = set()
        self.arrays: dict[str, tuple[np.dtype, int]] = {}  # machine arrays: dtype and length
        self.loops: list[tuple[int, int]] = []

    def statement(self, line: str) -> list[str]:
        indent = line[:len(line) - len(line.lstrip())]
        text = line.strip()
        if "while True" in text or "_interp" in text:
            raise Refused  # a nested rolled loop: its trips would not come back to the driver
        m = _NAN_CHECK.fullmatch(text)
        if m:
            return [f"{indent}check_f32({m[1]})"]
        m = _ROUNDED.fullmatch(text)
        if m:
            return [f"{indent}{m[2]} = r32({self.expression(m[1])})"]
        m = _PACKED.fullmatch(text)
        if m:
            return [indent + s for s in self.packed(m[1], m[2], m[3])]
        m = _KERNEL.fullmatch(text)
        if m and not isinstance(self.env.get(m[2]), float):
            return [indent + s for s in self.kernel(m[1], m[2], m[3].split(", "))]
        m = _READ.fullmatch(text)
        if m:
            return [indent + s for s in self.read(m[2], [n.strip() for n in m[1].split(",") if n.strip()])]
        if text.startswith("if not ") and text.endswith(": break"):
            return [f"{indent}if not {self.expression(text[7:-7])}: break"]
        if " = " not in text:
            raise Refused
        target, value = text.split(" = ", 1)
        if not all(_VARIABLE.fullmatch(n.strip()) for n in target.split(",") if n.strip()):
            raise Refused
        return [f"{indent}{target} = {self.expression(value)}"]

    def expression(self, text: str) -> str:
        def bitcast(m: re.Match) -> str:
            name = _BITCASTS.get((m[2], m[1]))
            if name is None:
                raise Refused
            return f"{name}({m[3]})"

        text = _DIVISION.sub(r"(\1 / \2)", _S64_WRAP.sub(r"(\1)", _BITCAST.sub(bitcast, text)))
        text = (text.replace("_divide_by_zero(", "divide_by_zero(").replace("_sqrt(", "math.sqrt(")
                .replace("_signaling()", "signaling()"))
        for name in set(re.findall(r"\b_g\d+\b", text)):
            value = self.env.get(name)
            if not isinstance(value, float):
                raise Refused
            if name not in self.defined:
                self.defined.add(name)
                self.constants.append(f"{name} = {_float_text(value)}")
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as e:
            raise Refused from e
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and not (node.id in _HELPERS or node.id in self.defined
                                                   or _VARIABLE.fullmatch(node.id)):
                raise Refused
            if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "math"):
                raise Refused
            if isinstance(node, ast.Constant) and isinstance(node.value, int) and abs(node.value) >= _WIDE:
                raise Refused
            if isinstance(node, ast.Constant) and not isinstance(node.value, bool | int | float):
                raise Refused
        return text

    def packed(self, var: str, elements: str, dtype_name: str) -> list[str]:
        dtype = self.env.get(dtype_name)
        if not isinstance(dtype, np.dtype) or dtype.kind not in "biuf" or dtype == np.uint64:
            raise Refused
        values = [e.strip() for e in elements.split(",") if e.strip()]
        self.arrays[var] = (dtype, len(values))
        return [f"{var} = np.empty({len(values)}, np.{dtype.name})",
                *[f"{var}[{k}] = {self.expression(v)}" for k, v in enumerate(values)]]

    def kernel(self, var: str, fn_name: str, args: list[str]) -> list[str]:
        ufunc = _ufunc_of(self.env.get(fn_name))
        if ufunc is None or ufunc.nout != 1 or ufunc.nin != len(args) or ufunc.nin > 2:
            raise Refused
        if any(a not in self.arrays for a in args):
            raise Refused  # a constant or an array of the loop's: stays with the Python code
        dtypes = [self.arrays[a][0] for a in args]
        sizes = {self.arrays[a][1] for a in args}
        if len(sizes) != 1:
            raise Refused
        found = ufunc_loop(ufunc, dtypes)
        if found is None:
            raise Refused
        function, data, out = found
        k = len(self.loops)
        self.loops.append((function, data))
        (n,) = sizes
        self.arrays[var] = (out, n)
        call = f"call{len(args)}(_p{k}, _d{k}, {', '.join(args)}, {var}, _scratch)"
        return [f"{var} = np.empty({n}, np.{out.name})", call]

    def read(self, array: str, names: list[str]) -> list[str]:
        if array not in self.arrays:
            raise Refused
        dtype, n = self.arrays[array]
        if n != len(names):
            raise Refused
        cast = "float" if dtype.kind == "f" else "bool" if dtype.kind == "b" else "int"
        return [f"{name} = {cast}({array}[{k}])" for k, name in enumerate(names)]


def _ufunc_of(kernel: Any) -> np.ufunc | None:
    """The ufunc a bound kernel is: the ufunc itself, or `elementwise_util.finish`'s wrapper of a
    ufunc on 0-d arrays (the same loop runs)."""
    if isinstance(kernel, np.ufunc):
        return kernel
    if getattr(kernel, "__name__", "") == "scalar_ufunc" and kernel.__closure__:
        found = [c.cell_contents for c in kernel.__closure__ if isinstance(c.cell_contents, np.ufunc)]
        return found[0] if len(found) == 1 else None
    return None


class _UFuncObject(ctypes.Structure):
    """The head of numpy's PyUFuncObject (ufuncobject.h): its legacy loops, one per `types` entry."""

    _fields_ = [("ob_refcnt", ctypes.c_ssize_t), ("ob_type", ctypes.c_void_p), ("nin", ctypes.c_int),
                ("nout", ctypes.c_int), ("nargs", ctypes.c_int), ("identity", ctypes.c_int),
                ("functions", ctypes.POINTER(ctypes.c_void_p)), ("data", ctypes.POINTER(ctypes.c_void_p)),
                ("ntypes", ctypes.c_int)]


_LOOP = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_checked: dict[tuple[str, tuple[str, ...]], tuple[int, int, np.dtype] | None] = {}


def ufunc_loop(ufunc: np.ufunc, dtypes: list[np.dtype]) -> tuple[int, int, np.dtype] | None:
    """numpy's inner loop of `ufunc` for operands of exactly `dtypes`: (function, data, result dtype),
    or None. Used only if it gives the ufunc's own bits on a sample of values (numpy may run
    another loop than its legacy table's, e.g. an ArrayMethod registered since)."""
    key = (ufunc.__name__, tuple(d.char for d in dtypes))
    if key in _checked:
        return _checked[key]
    found = None
    head = _UFuncObject.from_address(id(ufunc))
    if head.nin == ufunc.nin and head.nout == ufunc.nout and head.ntypes == len(ufunc.types):
        for k, signature in enumerate(ufunc.types):
            ins, out = signature.split("->")
            if tuple(ins) == key[1] and len(out) == 1 and head.functions[k]:
                found = (head.functions[k], head.data[k] or 0, np.dtype(out))
                break
    if found is not None and not _same_bits(ufunc, dtypes, *found):
        found = None
    _checked[key] = found
    return found


def _same_bits(ufunc: np.ufunc, dtypes: list[np.dtype], function: int, data: int, out: np.dtype) -> bool:
    rng = np.random.default_rng(0)
    n = 4096
    arrays = []
    for dtype in dtypes:
        raw = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype).copy()
        if dtype.kind == "f":  # ordinary magnitudes and the edges, besides random bit patterns
            raw[: n // 2] = rng.standard_normal(n // 2) * 10.0 ** rng.integers(-8, 9, n // 2)
            raw[:8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5]
        elif dtype.kind == "b":
            raw = rng.integers(0, 2, n).astype(bool)
        arrays.append(raw)
    result = np.empty(n, out)
    pointers = (ctypes.c_void_p * (len(arrays) + 1))(*[a.ctypes.data for a in arrays], result.ctypes.data)
    dims = (ctypes.c_ssize_t * 1)(n)
    steps = (ctypes.c_ssize_t * (len(arrays) + 1))(*[a.itemsize for a in arrays], out.itemsize)
    with np.errstate(all="ignore"):
        _LOOP(function)(pointers, dims, steps, data or None)
        want = ufunc(*arrays)
    return want.dtype == out and want.tobytes() == result.tobytes()
