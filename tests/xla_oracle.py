"""Run StableHLO operations on XLA:CPU (through jaxlib) as the oracle for element-wise kernels.

`jax.lax` hides some XLA operations behind its own lowering (integer `power`, `convert` to pred,
`clamp` argument order), so the kernels' tests compile the StableHLO operations themselves and run
them on the CPU client jax uses: the answer is XLA's, not jax's. Several operations on the same
operands compile into one module (compiling is the slow part).

XLA's answers are also kept in `tests/golden/xla_oracle.zip`, keyed by the module text and the
operands' bytes, so a fresh machine does not compile hundreds of oracle modules: a key the store
lacks (a new or changed test) is computed by XLA as before, and the run's summary counts them.
`REPLICAS_GOLDEN=record` adds the answers the run used to the store (delete it first and record
the whole suite to prune it); `REPLICAS_GOLDEN=verify` computes every answer with XLA and fails a
test whose recorded answer differs (a stale store, say after a JAX upgrade).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import types
import weakref
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
from jax._src import xla_bridge  # noqa: E402
from jax._src.lib import xla_client  # noqa: E402

_ELEMENT_TYPES = {
    "bool": "i1", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "ui8", "uint16": "ui16", "uint32": "ui32", "uint64": "ui64",
    "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
    "complex64": "complex<f32>", "complex128": "complex<f64>",
    "float8_e4m3fn": "f8E4M3FN", "float8_e5m2": "f8E5M2", "float8_e4m3b11fnuz": "f8E4M3B11FNUZ",
    "float8_e5m2fnuz": "f8E5M2FNUZ", "float8_e4m3fnuz": "f8E4M3FNUZ", "int4": "i4", "uint4": "ui4",
    "int2": "i2", "uint2": "ui2",
}

# HLO opcodes whose StableHLO / CHLO spelling is not "stablehlo." + opcode with "_" for "-".
_SPELLING = {"erf": "chlo.erf", "acos": "chlo.acos", "acosh": "chlo.acosh", "asin": "chlo.asin",
             "asinh": "chlo.asinh", "atan": "chlo.atan", "atanh": "chlo.atanh", "cosh": "chlo.cosh",
             "sinh": "chlo.sinh"}


def stablehlo_name(opcode: str) -> str:
    return _SPELLING.get(opcode, "stablehlo." + opcode.replace("-", "_"))


def tensor_type(shape: tuple[int, ...], dtype: Any) -> str:
    element = _ELEMENT_TYPES[np.dtype(dtype).name]
    return "tensor<" + "".join(f"{d}x" for d in shape) + element + ">"


@dataclass(frozen=True)
class Call:
    """One operation: `op` (HLO opcode or StableHLO name) applied to operands `args` (indices)."""

    op: str
    args: tuple[int, ...]
    out_dtype: Any
    out_shape: tuple[int, ...] | None = None  # default: the first argument's shape
    attrs: str = ""


@functools.cache
def _compiled(calls: tuple[tuple[str, tuple[int, ...], str, str], ...], in_types: tuple[str, ...]) -> Any:
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(in_types))
    lines = []
    for k, (op, args, out_type, attrs) in enumerate(calls):
        arg_list = ", ".join(f"%a{i}" for i in args)
        arg_types = ", ".join(in_types[i] for i in args)
        lines.append(f'  %r{k} = "{op}"({arg_list}) {attrs} : ({arg_types}) -> {out_type}')
    results = ", ".join(f"%r{k}" for k in range(len(calls)))
    out_types = ", ".join(c[2] for c in calls)
    text = (f"module @oracle {{\n func.func public @main({params}) -> ({out_types}) {{\n" + "\n".join(lines)
            + f"\n  return {results} : {out_types}\n }}\n}}\n")
    return compile_stablehlo(text)


def compile_stablehlo(text: str) -> Any:
    """A StableHLO module compiled for one CPU device. Compiling is the oracle's cost, so compiled
    executables are kept on disk (conftest.py points REPLICAS_XLA_ORACLE_CACHE at a directory that
    outlives the run), keyed by the module text and the jaxlib version."""
    backend = xla_bridge.get_backend("cpu")
    devices = xla_client.DeviceList(tuple(backend.local_devices()[:1]))
    options = xla_client.CompileOptions()
    cache = os.environ.get("REPLICAS_XLA_ORACLE_CACHE")
    if not cache:
        return backend.compile_and_load(text, devices, options)
    key = hashlib.sha256(f"{jax.__version__}\n{text}".encode()).hexdigest()
    path = Path(cache) / key
    if path.exists():
        try:
            return backend.deserialize_executable(path.read_bytes(), devices, options)
        except Exception:  # noqa: BLE001 - a stale or torn entry is recompiled
            pass
    exe = backend.compile_and_load(text, devices, options)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(backend.serialize_executable(exe))
    tmp.replace(path)  # atomic: concurrent runs never read a half-written entry
    return exe


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, name))


class StaleGoldenAnswer(AssertionError):
    """A recorded answer that XLA no longer gives (`REPLICAS_GOLDEN=verify`)."""


class GoldenStore:
    """XLA's recorded answers: per key, `<key>.json` (dtype and shape of each result) and `<key>.bin`
    (their bytes, in order) in one zip file. Large answers are left out: they are few, and XLA
    computes them in one compilation each."""

    LARGEST = 64 << 10

    def __init__(self, path: Path, mode: str) -> None:
        if mode not in ("", "record", "verify"):
            raise ValueError(f"REPLICAS_GOLDEN={mode!r}: expected 'record' or 'verify'")
        self.path, self.record, self.verify = path, mode == "record", mode == "verify"
        self.used: dict[str, list[np.ndarray]] = {}
        self.computed = 0  # answers XLA computed in this process that the store could have held
        self._zip = zipfile.ZipFile(path) if path.exists() and not self.record else None

    def answer(self, program: Any, operands: list[np.ndarray], compute: Any) -> list[np.ndarray]:
        """The recorded answer of `program` (anything whose repr names the computation) on
        `operands`, else `compute()`'s."""
        name = repr(program)
        if re.search(r" at 0x[0-9a-f]+", name):
            raise ValueError(f"an oracle key names an object by its address, which no other run shares: {name[:400]}")
        digest = hashlib.sha256(name.encode())
        for o in operands:
            digest.update(repr((o.dtype.name, o.shape)).encode())
            digest.update(np.ascontiguousarray(o).tobytes())
        key = digest.hexdigest()
        results = self.get(key)
        if results is None or self.verify:
            computed = [np.asarray(r) for r in compute()]
            self.computed += sum(r.nbytes for r in computed) <= self.LARGEST  # the ones the store could hold
            is_text = isinstance(program, tuple) and program[:1] == ("text",)
            if results is not None and not same_answer(results, computed, is_text):
                raise StaleGoldenAnswer(f"tests/golden/xla_oracle.zip: XLA's answer to {repr(program)[:300]} is no "
                                        "longer the recorded one; rerecord with REPLICAS_GOLDEN=record")
            results = computed
        if self.record and sum(r.nbytes for r in results) <= self.LARGEST:
            self.used[key] = results
        return results

    def get(self, key: str) -> list[np.ndarray] | None:
        if self._zip is None:
            return None
        try:
            meta = json.loads(self._zip.read(f"{key}.json"))
        except KeyError:
            return None
        data, results, offset = self._zip.read(f"{key}.bin"), [], 0
        for name, shape in meta:
            dtype = _dtype(name)
            count = int(np.prod(shape, dtype=np.int64))
            results.append(np.frombuffer(data, dtype, count, offset).reshape(shape).copy())
            offset += count * dtype.itemsize
        return results

    def write(self) -> None:
        """Add the answers this process used to the store (conftest.py calls it at the run's end)."""
        if not self.record:
            return
        self.path.parent.mkdir(exist_ok=True)
        # Runs on several pytest-xdist workers record at once: one merges at a time.
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
                if self.path.exists():  # a run of some test files keeps the others' answers
                    with zipfile.ZipFile(self.path) as old:
                        for info in old.infolist():
                            if info.filename.split(".")[0] not in self.used:
                                z.writestr(info, old.read(info))
                for key in sorted(self.used):
                    results = self.used[key]
                    z.writestr(f"{key}.json", json.dumps([[r.dtype.name, list(r.shape)] for r in results]))
                    z.writestr(f"{key}.bin", b"".join(np.ascontiguousarray(r).tobytes() for r in results))
            tmp.replace(self.path)
        self.path.with_suffix(".lock").unlink(missing_ok=True)


def same_answer(recorded: list[np.ndarray], computed: list[np.ndarray], is_text: bool = False) -> bool:
    """The same results: bitwise (NaN payloads included: the oracle is deterministic), except for
    the debug information in JAX's texts (source paths and Python stack frames, which depend on
    where and how the tests run, not on JAX)."""
    def same(a: np.ndarray, b: np.ndarray) -> bool:
        if is_text:  # jax_text's answer: the text's bytes
            return _without_debug_info(a.tobytes().decode()) == _without_debug_info(b.tobytes().decode())
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

    return len(recorded) == len(computed) and all(same(a, b) for a, b in zip(recorded, computed))


def _without_debug_info(text: str) -> str:
    text = re.sub(r",? metadata=\{[^{}]*\}", "", text)
    return re.sub(r"\n(FileNames|FunctionNames|FileLocations|StackFrames)\n([^\n]+\n)*", "\n", text)


GOLDEN = GoldenStore(Path(__file__).parent / "golden" / "xla_oracle.zip", os.environ.get("REPLICAS_GOLDEN", ""))


def run_many(calls: list[Call], operands: list[Any]) -> list[np.ndarray]:
    operands = [np.asarray(o) for o in operands]
    in_types = tuple(tensor_type(o.shape, o.dtype) for o in operands)
    key = []
    for c in calls:
        op = c.op if "." in c.op else stablehlo_name(c.op)
        shape = operands[c.args[0]].shape if c.out_shape is None else c.out_shape
        key.append((op, tuple(c.args), tensor_type(shape, c.out_dtype), c.attrs))
    return GOLDEN.answer((tuple(key), in_types), operands, lambda: execute(_compiled(tuple(key), in_types), operands))


def execute(exe: Any, operands: list[np.ndarray]) -> list[np.ndarray]:
    device = jax.devices("cpu")[0]
    outputs = exe.execute_sharded([jax.device_put(o, device) for o in operands])
    return [np.asarray(r[0]) for r in outputs.disassemble_into_single_device_arrays()]


def run_stablehlo(op: str, operands: list[Any], out_dtype: Any, out_shape: tuple[int, ...] | None = None,
                  attrs: str = "") -> np.ndarray:
    """One operation on all `operands`."""
    return run_many([Call(op, tuple(range(len(operands))), out_dtype, out_shape, attrs)], operands)[0]


_FUNCTION_NAMES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _stable(value: Any) -> Any:
    """`value` as text that names it the same way in every run (no object addresses)."""
    if isinstance(value, types.ModuleType):  # its repr names the file: the venv's path
        return f"module {value.__name__}"
    if isinstance(value, functools.partial):
        return f"partial({_stable(value.func)}, {_stable(value.args)}, {_stable(value.keywords)})"
    code = getattr(value, "__code__", None)
    wrapped = getattr(value, "__wrapped__", None)
    if code is not None or wrapped is not None:
        # A function is named once, before anything calls it: JAX's wrappers keep state in their
        # closures (shard_map's axis names), so after a call the same function would read differently,
        # and a run that finds every answer recorded (calls nothing) would ask for other keys.
        try:
            return _FUNCTION_NAMES[value]
        except (KeyError, TypeError):
            pass
        if code is None:  # jax.jit's PjitFunction (jnp.linalg.solve, ...)
            name = f"{type(value).__name__}({_stable(wrapped)})"
        else:
            cells = tuple(_stable(c.cell_contents) for c in (value.__closure__ or ()))
            name = f"{value.__module__}.{value.__qualname__}@{code.co_firstlineno}{cells}"
        try:
            _FUNCTION_NAMES[value] = name
        except TypeError:  # not weakly referenceable
            pass
        return name
    if isinstance(value, (tuple, list)):
        return type(value).__name__ + repr(tuple(_stable(v) for v in value))
    if isinstance(value, dict):
        return repr(sorted((k, _stable(v)) for k, v in value.items()))
    if isinstance(value, np.ndarray):  # its repr elides large arrays
        digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
        return f"ndarray({value.dtype.name}, {value.shape}, {digest})"
    return repr(value)


def lax_answer(fn: Any, *args: Any, **params: Any) -> Any:
    """`fn(*args, **params)` computed by JAX (or recorded), as numpy: one array, or a tuple when the
    result has several. Array leaves of `args` are the operands; everything else names the program."""
    leaves, tree = jax.tree.flatten(args)
    is_operand = [isinstance(leaf, (np.ndarray, np.generic)) for leaf in leaves]
    operands = [np.asarray(leaf) for leaf, op in zip(leaves, is_operand) if op]
    program = ("lax", _stable(fn), str(tree), [None if op else _stable(leaf) for leaf, op in zip(leaves, is_operand)],
               _stable(params), jax.config.jax_enable_x64)
    results = GOLDEN.answer(program, operands,
                            lambda: [np.asarray(r) for r in jax.tree.leaves(fn(*args, **params))])
    return results[0] if len(results) == 1 else tuple(results)


def jit_answer(fn: Any, args: list[Any]) -> list[np.ndarray]:
    """The leaves of `jax.jit(fn)(*args)`, computed by JAX (or recorded), as numpy arrays."""
    operands = [np.asarray(a) for a in args]
    return GOLDEN.answer(("jit", _stable(fn), jax.config.jax_enable_x64), operands,
                         lambda: [np.asarray(r) for r in jax.tree.leaves(jax.jit(fn)(*args))])


def jax_text(fn: Any, args: list[Any], form: str = "lowered") -> str:
    """The HLO text of `fn` on arrays like `args`: as JAX lowers it ("lowered") or as XLA:CPU compiled
    it ("compiled"). Recorded per JAX version, so a new JAX's text is tested, not an old one's."""
    def lower() -> list[np.ndarray]:
        lowered = jax.jit(fn).lower(*args)
        text = lowered.as_text(dialect="hlo") if form == "lowered" else lowered.compile().as_text()
        return [np.frombuffer(text.encode(), np.uint8)]

    program = ("text", jax.__version__, _stable(fn), form, [(np.asarray(a).dtype.name, np.shape(a)) for a in args],
               jax.config.jax_enable_x64)
    (text,) = GOLDEN.answer(program, [], lower)
    return text.tobytes().decode()
