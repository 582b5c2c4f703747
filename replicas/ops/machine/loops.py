"""A per-element While loop compiled to machine code once it has run long enough to pay for it.

`compile_loop` (`ops.python_elements`) gives a While loop of small values as one generated Python
function; its trip is hundreds of Python statements. `tiered` wraps that function:
calls run the Python code and add up its time (calls that end normally: one ended by an abort
paid for nothing), and once that time passes what compiling would cost (estimated by the trip's
statements), the loop's trip is translated (`ops.machine.text`) and compiled to LLVM IR
(`ops.machine.emit`, llvmlite) in a background thread while the replicas go on with the Python
code, which keeps checking for aborts; the calls after it is ready run it as machine code with the
same bits. Compiled code is shared by source within a process (every replica thread of a job).

The machine code runs a bounded number of trips per call (`trips(..., budget)`) without the GIL,
then returns to the Python driver, which checks for a cancel, timeout or deadlock abort as the
interpreter's loops do, and doubles the budget while a call takes under `SLICE_SECONDS`. Without
llvmlite, or when a loop has no machine form or fails to compile, the Python code runs, silently.

`REPLICAS_COMPILED_LOOPS`: `auto` (the default: as above), `on` (compile at a loop's first call,
for tests and benchmarks), `off` (never).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from replicas.ops.machine.text import Refused, Translation, translate

log = logging.getLogger(__name__)

# Seconds of a loop's Python time (all its replicas in this process) before it is compiled: what
# the compile costs (llvmlite's start, then LLVM's optimization of the trip, by its statements).
COMPILE_SECONDS = 0.05
COMPILE_SECONDS_PER_STATEMENT = 0.0003
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

    __slots__ = ("text", "spent", "calls", "threshold", "translation", "trips", "kinds", "failed", "compiling",
                 "trial", "trial_spent")

    def __init__(self, text: str, statements: int, mode: str) -> None:
        self.text = text
        self.spent = 0.0  # the Python code's time and calls
        self.calls = 0
        self.threshold = 0.0 if mode == "on" else COMPILE_SECONDS + COMPILE_SECONDS_PER_STATEMENT * statements
        self.translation: Translation | None = None
        self.trips: Callable[..., Any] | None = None
        self.kinds: list[str] = []  # the state's kinds ("i", "f", "b") the trips were compiled for
        self.failed = False
        self.compiling = False
        # The machine code's first calls are timed: a loop of few trips a call may cost less as Python
        # than the machine code's call (its state's conversion), and goes back to Python then.
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
        shared.threshold = 0.0
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
            if not shared.compiling and shared.spent >= shared.threshold:
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


def _machine(loop: _Tiered) -> Callable[[Any], Any] | None:
    """`loop`'s machine driver, its trips compiled."""
    try:
        return _driver(loop, loop.shared.translation, loop.shared.trips, loop.shared.kinds)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - the Python code stays: correct, only slower
        log.debug("compiled loop driver failed", exc_info=True)
        loop.shared.failed = True
        return None


def _tier_up(loop: _Tiered, a0: Any) -> None:
    """Start compiling `loop`'s trips: in the background, while the replicas run the Python code, which
    keeps checking for aborts; in this call when compiled loops are `on`."""
    shared = loop.shared
    if importlib.util.find_spec("llvmlite") is None:
        shared.failed = True
        return
    try:
        if shared.translation is None:
            shared.translation = translate(shared.text, loop.env)
        # The types the code is compiled for: those of this call's state on entry.
        state = _driver(loop, shared.translation, None, []).entry(a0)  # type: ignore[attr-defined]
    except Refused:
        shared.failed = True
        return
    except Exception:  # noqa: BLE001 - the Python code stays: correct, only slower
        log.debug("loop not translated", exc_info=True)
        shared.failed = True
        return
    shared.compiling = True
    kinds = ["b" if isinstance(v, bool) else "f" if isinstance(v, float) else "i" for v in state]
    if mode() == "on":
        _compile(shared, kinds)
    else:
        threading.Thread(target=_compile, args=(shared, kinds), name="replicas-compile-loop", daemon=True).start()


def _compile(shared: _Shared, kinds: list[str]) -> None:
    translation = shared.translation
    assert translation is not None
    try:
        from replicas.ops.machine import emit

        with _lock:
            trips = emit.compile_trips(translation.source, kinds, translation.loops)
        shared.kinds = kinds
        shared.trips = trips
    except Exception:  # noqa: BLE001 - no llvmlite, or a construct the emitter does not write: Python stays
        log.debug("loop not compiled", exc_info=True)
        shared.failed = True
    finally:
        shared.compiling = False


def _driver(loop: _Tiered, translation: Translation, trips: Callable[..., Any] | None,
            kinds: list[str]) -> Callable[[Any], Any]:
    """The Python function around the machine code: the loop's prologue and result as the Python code
    has them, and between, calls of `trips` of a growing budget with an abort check before each. The
    state goes in and out through two arrays: integers and bools in one, floats in the other."""
    places, counts = [], {"i": 0, "f": 0}
    for name, kind in zip(translation.state, kinds):
        group = "f" if kind == "f" else "i"
        places.append((name, f"{'_doubles' if group == 'f' else '_ints'}[{counts[group]}]", kind))
        counts[group] += 1
    text = "\n".join([
        "def run(a0):", "    try:", *translation.prologue,
        "        _b = _budget[0]",
        "        while True:",
        "            if _interp.mailbox is not None and _interp.mailbox.aborted is not None: "
        "raise _interp.mailbox.aborted",
        "            _t = _clock()",
        *[f"            {place} = {name}" for name, place, _ in places],
        "            _done = _trips(_ints, _doubles, _b)",
        *[f"            {name} = {place}" + (" != 0" if kind == "b" else "") for name, place, kind in places],
        "            if _done == 2: raise _SignalingNaN",
        "            if _done: break",
        f"            if _b < {MAX_BUDGET} and _clock() - _t < {SLICE_SECONDS}: _b = _budget[0] = 2 * _b",
        translation.result,
        "    except _SignalingNaN:", "        return run.plain(a0)", "",
        "def entry(a0):", *[line[4:] for line in translation.prologue],
        f"    return ({', '.join(translation.state)},)", ""])
    env = dict(loop.env)
    env.update({"_trips": trips, "_budget": [FIRST_BUDGET], "_clock": time.perf_counter,
                # the state's arrays, one pair per driver (a replica's thread)
                "_ints": (ctypes.c_int64 * max(1, counts["i"]))(),
                "_doubles": (ctypes.c_double * max(1, counts["f"]))()})
    exec(compile(text, f"<machine loop {translation.key}>", "exec"), env)  # noqa: S102
    run = env["run"]
    run.plain = loop.python.plain  # type: ignore[attr-defined]
    run.entry = env["entry"]
    return run
