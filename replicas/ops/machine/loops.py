"""A per-element While loop compiled to machine code by numba once it has run long enough to pay for it.

`compile_loop` (`ops.python_elements`) gives a While loop of small values as one generated Python
function; its trip is hundreds of Python statements, each ~50 ns. `tiered` wraps that function:
calls run the Python code and add up its time (calls that end normally: one ended by an abort
paid for nothing), and once that time passes what compiling would cost (numba takes seconds for a
trip of hundreds of ops), the loop's trip is translated (`ops.machine.text`) and compiled in a
background thread while the replicas go on with the Python code, which keeps checking for aborts;
the calls after it is ready run it as machine code with the same bits.
The compiled module is a file in the cache directory, compiled with numba's on-disk cache: another
process (a Ray actor, the next run) loads it in a fraction of the compile, so a loop found there
is loaded as soon as its Python time passes `LOAD_SECONDS`. Compiled code is shared by source
within a process (every replica thread of a job).

The machine code runs a bounded number of trips per call (`trips(..., budget)`) without the GIL,
then returns to the Python driver, which checks for a cancel, timeout or deadlock abort as the
interpreter's loops do, and doubles the budget while a call takes under `SLICE_SECONDS`. Without
numba, or when a loop has no machine form or fails to compile, the Python code runs, silently.

`REPLICAS_COMPILED_LOOPS`: `auto` (the default: as above), `on` (compile at a loop's first call,
for tests and benchmarks), `off` (never). `REPLICAS_CACHE_DIR`: where compiled loops are kept
(default `$XDG_CACHE_HOME/replicas` or `~/.cache/replicas`).
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from replicas.ops.machine.text import Refused, Translation, translate

log = logging.getLogger(__name__)

# Seconds of a loop's Python time (all its replicas in this process) before it is compiled: what
# compiling costs, estimated by the trip's statements, or loading from the on-disk cache; importing
# numba first, in a process that has not.
COMPILE_SECONDS = 0.5
COMPILE_SECONDS_PER_STATEMENT = 0.005
LOAD_SECONDS = 0.05
IMPORT_SECONDS = 0.6
TRIAL_CALLS = 8
SLICE_SECONDS = 0.005  # a machine-code call's length the trip budget grows to: the abort check's period
FIRST_BUDGET = 64
MAX_BUDGET = 1 << 24
MAX_LOOPS = 1024  # loops remembered per process (a bound loop keeps its own entry however many are)

_lock = threading.Lock()  # one compile at a time in the process
_table_lock = threading.Lock()  # guards `_loops`
_loops: dict[str, _Shared] = {}  # generated Python text -> what its replicas share


class _Shared:
    """A loop's state in this process, shared by every replica that bound the same Python code."""

    __slots__ = ("text", "spent", "calls", "threshold", "translation", "trips", "failed", "checked", "compiling",
                 "trial", "trial_spent")

    def __init__(self, text: str, statements: int, mode: str) -> None:
        self.text = text
        self.spent = 0.0  # the Python code's time and calls
        self.calls = 0
        self.threshold = 0.0 if mode == "on" else (COMPILE_SECONDS + COMPILE_SECONDS_PER_STATEMENT * statements
                                                   + _import_seconds())
        self.translation: Translation | None = None
        self.trips: Callable[..., Any] | None = None
        self.failed = False
        self.checked = mode == "on"  # looked in the on-disk cache
        self.compiling = False
        # The machine code's first calls are timed: a loop of few trips a call may cost less as Python
        # than the machine code's call (its arguments' conversion), and goes back to Python then.
        self.trial = TRIAL_CALLS
        self.trial_spent = 0.0


def mode() -> str:
    value = os.environ.get("REPLICAS_COMPILED_LOOPS", "auto").strip().lower()
    return {"1": "on", "0": "off", "true": "on", "false": "off"}.get(value, value)


def tiered(python: Callable[[Any], Any], text: str, env: dict[str, Any], statements: int) -> Callable[[Any], Any]:
    """The loop `python` (generated from `text` with globals `env`) as a callable that moves to
    machine code when it pays; `python` itself when compiled loops are off."""
    how = mode()
    if how == "off" or "while True:" not in text:
        return python
    with _table_lock:
        shared = _loops.get(text)
        if shared is None:
            while len(_loops) >= MAX_LOOPS:
                del _loops[next(iter(_loops))]  # the oldest
            shared = _loops[text] = _Shared(text, statements, how)
    if how == "on":
        shared.threshold, shared.checked = 0.0, True
    return _Tiered(python, env, shared)


def compiled_loops() -> int:
    """How many loops have their trips compiled in this process (among those it remembers)."""
    with _table_lock:
        return sum(1 for shared in _loops.values() if shared.trips is not None)


def is_compiled(loop: Callable[[Any], Any]) -> bool:
    """Whether the loop `loop` (as `tiered` gave it) has its trips compiled in this process."""
    return isinstance(loop, _Tiered) and loop.shared.trips is not None


class _Tiered:
    """A bound loop: its Python code until the machine code is ready, then the machine driver."""

    __slots__ = ("python", "env", "shared", "machine")

    def __init__(self, python: Callable[[Any], Any], env: dict[str, Any], shared: _Shared) -> None:
        self.python = python
        self.env = env
        self.shared = shared
        self.machine: Callable[[Any], Any] | None = None

    @property
    def plain(self) -> Any:
        """What a recorded run (and a call meeting an f32 signaling NaN) steps through instead."""
        return self.python.plain  # type: ignore[attr-defined]

    @plain.setter
    def plain(self, value: Any) -> None:
        self.python.plain = value  # type: ignore[attr-defined]
        if self.machine is not None:
            self.machine.plain = value  # type: ignore[attr-defined]

    def __call__(self, a0: Any) -> Any:
        shared = self.shared
        if not shared.failed:
            if self.machine is None and shared.trips is not None:
                self.machine = _machine(self)
            if self.machine is not None:
                return self.timed(a0) if shared.trial > 0 else self.machine(a0)
            if not shared.compiling and (shared.spent >= shared.threshold
                                         or (not shared.checked and shared.spent >= LOAD_SECONDS)):
                _tier_up(self, a0)
                if shared.trips is not None:  # compiled in this call (`on`)
                    return self(a0)
        if shared.failed:
            return self.python(a0)
        start = time.perf_counter()
        result = self.python(a0)  # a call ended by an abort does not count: it paid for nothing
        shared.spent += time.perf_counter() - start
        shared.calls += 1
        return result

    def timed(self, a0: Any) -> Any:
        """A machine-code call of the trial: the last one compares their mean with the Python code's."""
        shared = self.shared
        start = time.perf_counter()
        result = self.machine(a0)  # type: ignore[misc]
        shared.trial_spent += time.perf_counter() - start
        shared.trial -= 1
        if shared.trial == 0 and shared.calls and shared.trial_spent / TRIAL_CALLS > shared.spent / shared.calls:
            shared.failed = True  # slower than the Python code: it stays
        return result


def _import_seconds() -> float:
    return 0.0 if "numba" in sys.modules else IMPORT_SECONDS


def _machine(loop: _Tiered) -> Callable[[Any], Any] | None:
    """`loop`'s machine driver, its trips compiled."""
    try:
        return _driver(loop, loop.shared.translation, loop.shared.trips)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - the Python code stays: correct, only slower
        log.debug("compiled loop driver failed", exc_info=True)
        loop.shared.failed = True
        return None


def _tier_up(loop: _Tiered, a0: Any) -> None:
    """Start compiling `loop`'s trips (after looking in the on-disk cache, the first time): in the
    background, while the replicas run the Python code, which keeps checking for aborts; in this
    call when compiled loops are `on`."""
    shared = loop.shared
    try:
        if shared.translation is None:
            shared.translation = translate(shared.text, loop.env)
        translation = shared.translation
        path = _source_file(translation)
        if not shared.checked:
            shared.checked = True
            if os.path.exists(path + ".compiled"):
                shared.threshold = min(shared.threshold, LOAD_SECONDS + _import_seconds())
            if shared.spent < shared.threshold:
                return
        # The types numba compiles for: those of this call's state on entry.
        state = _driver(loop, translation, None).entry(a0)  # type: ignore[attr-defined]
    except Refused:
        shared.failed = True
        return
    except Exception:  # noqa: BLE001
        log.debug("loop not translated", exc_info=True)
        shared.failed = True
        return
    shared.compiling = True
    if mode() == "on":
        _compile(shared, path, state)
    else:
        threading.Thread(target=_compile, args=(shared, path, state), name="replicas-compile-loop",
                         daemon=True).start()


def _compile(shared: _Shared, path: str, state: tuple) -> None:
    translation = shared.translation
    assert translation is not None
    try:
        with _lock, open(path + ".lock", "a") as lock:
            cached = os.path.exists(path + ".compiled")
            if not cached:
                try:  # one process compiles (a job's actors run the same loops); the others load it after
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    shared.threshold = shared.spent + LOAD_SECONDS  # looked at again a little later
                    return
            trips = _load(translation, path).trips
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trips(*state, 0, *[a for pair in translation.loops for a in pair])  # numba compiles at a first call
            if not cached:
                with open(path + ".compiled", "w"):
                    pass
        shared.trips = trips
    except Exception:  # noqa: BLE001 - no numba, or numba refused the code: the Python code stays
        log.debug("loop not compiled", exc_info=True)
        shared.failed = True
    finally:
        shared.compiling = False


def cache_dir() -> str:
    base = os.environ.get("REPLICAS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "replicas")
    return os.path.join(base, "loops")


def _source_file(translation: Translation) -> str:
    """The module's file, written once (atomically) under its digest: numba's cache keys on the file's
    stamp, so an existing one is left as it is."""
    directory = cache_dir()
    path = os.path.join(directory, f"loop_{translation.key}.py")
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        temporary = f"{path}.{os.getpid()}.{threading.get_ident()}"
        with open(temporary, "w") as f:
            f.write(translation.source)
        os.replace(temporary, path)
    return path


def _load(translation: Translation, path: str) -> Any:
    name = f"replicas_loop_{translation.key}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return module


def _driver(loop: _Tiered, translation: Translation, trips: Callable[..., Any] | None) -> Callable[[Any], Any]:
    """The Python function around the machine code: the loop's prologue and result as the Python code
    has them, and between, calls of `trips` of a growing budget with an abort check before each."""
    names = ", ".join(translation.state)
    loops = "".join(f", _p{k}, _d{k}" for k in range(len(translation.loops)))
    text = "\n".join([
        "def run(a0):", "    try:", *translation.prologue,
        "        _b = _budget[0]",
        "        while True:",
        "            if _interp.mailbox is not None and _interp.mailbox.aborted is not None: "
        "raise _interp.mailbox.aborted",
        "            _t = _clock()",
        f"            _done, {names}, = _trips({names}, _b{loops})",
        "            if _done: break",
        f"            if _b < {MAX_BUDGET} and _clock() - _t < {SLICE_SECONDS}: _b = _budget[0] = 2 * _b",
        translation.result,
        "    except _SignalingNaN:", "        return run.plain(a0)", "",
        "def entry(a0):", *[line[4:] for line in translation.prologue], f"    return ({names},)", ""])
    env = dict(loop.env)
    env.update({"_trips": trips, "_budget": [FIRST_BUDGET], "_clock": time.perf_counter})
    for k, (function, data) in enumerate(translation.loops):
        env[f"_p{k}"], env[f"_d{k}"] = function, data
    exec(compile(text, f"<machine loop {translation.key}>", "exec"), env)  # noqa: S102
    run = env["run"]
    run.plain = loop.python.plain  # type: ignore[attr-defined]
    run.entry = env["entry"]
    return run
