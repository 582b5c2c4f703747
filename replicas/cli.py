"""`replicas run | check | trace | demo`: the command line."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import warnings
import zipfile
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from replicas.checker import zero_arguments
from replicas.cluster.command import add_cluster_parser, cluster_command
from replicas.diagnostics.recorder import DEFAULT_CAPACITY
from replicas.errors import CollectiveMismatchError, DeadlockError, ProgramError, ReplicasError
from replicas.hlo.ir import Instruction
from replicas.npz import read_npz_array
from replicas.runtime.driver import DEFAULT_TIMEOUT, as_program, declared_replicas

DEMO_HLO = """\
HloModule all_reduce_demo, replica_count=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT sum = f32[] add(a, b)
}

ENTRY main {
  x = f32[8] parameter(0)
  id = u32[] replica-id()
  idf = f32[] convert(id)
  offset = f32[8] broadcast(idf), dimensions={}
  mine = f32[8] add(x, offset)
  total = f32[8] all-reduce(mine), replica_groups={}, to_apply=add
  gathered = f32[32] all-gather(mine), replica_groups={}, dimensions={0}
  ROOT out = (f32[8], f32[32]) tuple(total, gathered)
}
"""


def load_args(path: str | None, num_replicas: int, parameters: list[Instruction]) -> list[Any] | None:
    """An .npz of `arg0, arg1, ...` (every replica) or `r<R>_arg<I>` (per replica). Every key the
    program needs must be there, and no other: a ProgramError names the missing or extra keys."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise ProgramError(f"--args {path}: no such file")
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            npy = f.read(6) == b"\x93NUMPY"
        raise ProgramError(f"--args {path}: " + ("a single .npy array, not an .npz of arg0, arg1, ... (numpy.savez)"
                                                  if npy else "not an .npz file (not a zip archive; numpy.savez "
                                                  "writes one)"))
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, NotImplementedError, zipfile.BadZipFile) as e:  # "zip file version 9"
        raise ProgramError(f"--args {path}: not a readable .npz file: {e}") from None
    with data:
        keys = set(data.files)
        per_replica = any(re.fullmatch(r"r\d+_arg\d+", k) for k in keys)
        wanted = [f"r{r}_arg{i}" for r in range(num_replicas) for i in range(len(parameters))] if per_replica \
            else [f"arg{i}" for i in range(len(parameters))]
        missing = [k for k in wanted if k not in keys]
        extra = sorted(keys - set(wanted))
        if missing or extra:
            params = ", ".join(f"%{p.name} {p.shape}" for p in parameters) or "none"
            problems = ([f"missing {_some(missing)}"] if missing else []) + ([f"unexpected {_some(extra)}"]
                                                                             if extra else [])
            raise ProgramError(f"--args {path}: {'; '.join(problems)} (the program takes {len(parameters)} "
                               f"argument(s): {params}; keys are arg<I> for every replica or r<R>_arg<I> "
                               f"for each of the {num_replicas} replicas)")
        values = {}
        for k in wanted:
            values[k] = read_npz_array(data, k, f"--args {path}: {k}")  # its declared size checked first
    if per_replica:
        return [[values[f"r{r}_arg{i}"] for i in range(len(parameters))] for r in range(num_replicas)]
    return [values[f"arg{i}"] for i in range(len(parameters))]


def _some(keys: list[str], shown: int = 6) -> str:
    return ", ".join(keys[:shown]) + (f", ... ({len(keys)} in all)" if len(keys) > shown else "")


def summarize(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(summarize(v) for v in value) + ")"
    arr = np.asarray(value)
    if arr.size <= 8:
        return f"{arr.dtype}{list(arr.shape)} {np.array2string(arr.reshape(-1), separator=', ')}"
    flat = arr.reshape(-1).astype(np.float64) if arr.dtype.kind in "biuf" or arr.dtype.name == "bfloat16" else None
    stats = f" min={flat.min():.6g} max={flat.max():.6g} mean={flat.mean():.6g}" if flat is not None else ""
    return f"{arr.dtype}{list(arr.shape)}{stats}"


def save_results(path: str, results: list[Any]) -> None:
    out: dict[str, np.ndarray] = {}
    for r, value in enumerate(results):
        leaves = _leaves(value)
        for i, leaf in enumerate(leaves):
            out[f"r{r}" if len(leaves) == 1 and not isinstance(value, tuple) else f"r{r}_{i}"] = np.asarray(leaf)
    np.savez(path, **out)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


EXIT_CODES = """\
exit codes:
  0    the program ran (check: no deadlock, mismatch or error)
  2    bad input (options, program, --args), a replica failed, or the timeout expired
  3    deadlock or collective mismatch
  130  interrupted (Ctrl-C): the job was cancelled"""


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _common(p: argparse.ArgumentParser, timeout: float = DEFAULT_TIMEOUT) -> None:
    p.add_argument("program", help="an .hlo/.txt (HLO text) or .msgpack program")
    p.add_argument("--replicas", "-n", type=_positive_int, default=None,
                   help="number of replicas (None: the module's replica_count x num_partitions)")
    p.add_argument("--args", default=None, help=".npz with arg0, arg1, ... (every replica) or r<R>_arg<I> "
                   "(per replica)")
    p.add_argument("--zeros", action="store_true", help="give every parameter without --args zeros")
    p.add_argument("--timeout", type=_positive_float, default=timeout, help="seconds before ExecutionTimeout")
    p.add_argument("--elided", default="error", choices=("error", "zeros", "random"),
                   help="constants XLA printed as {...}: refuse (default), or fill with zeros / random values")
    p.add_argument("--quiet", "-q", action="store_true", help="no live status on stderr (shown only on a terminal)")
    p.add_argument("--trace-all", action="store_true",
                   help="the trace records every instruction, not only communication and feeds")
    p.add_argument("--trace-events", type=_positive_int, default=DEFAULT_CAPACITY,
                   help="events kept per replica (the last ones); a longer trace says it is truncated")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="replicas", description="Run one XLA program on N replicas.", epilog=EXIT_CODES,
                     formatter_class=_Formatter)
    sub = parser.add_subparsers(dest="command", required=True)
    kw = {"formatter_class": _Formatter, "epilog": EXIT_CODES}
    p_run = sub.add_parser("run", help="run a program on N replicas (Ray actors)", **kw)
    _common(p_run)
    p_run.add_argument("--address", default=None,
                       help='Ray cluster to join ("auto", "host:port", "ray://host:port"); None: a local Ray')
    p_run.add_argument("--out", default=None, help="save the results to this .npz (keys r<R> or r<R>_<I>)")
    p_run.add_argument("--trace", default=None, help="write a Chrome trace-event file (Perfetto)")
    p_run.add_argument("--backend", default="ray", choices=("ray", "threads"), help="what runs the replicas")
    p_check = sub.add_parser("check", help="run on N threads (no Ray) and report deadlocks, mismatches and "
                             "messages nobody received; parameters without --args are zeros", **kw)
    _common(p_check)
    p_check.add_argument("--lenient", action="store_true",
                         help="pair different collective instructions of the same form (strict=False)")
    p_check.add_argument("--trace", default=None, help="write a Chrome trace-event file (Perfetto)")
    p_trace = sub.add_parser("trace", help="run and write a Chrome trace-event file (Perfetto)", **kw)
    _common(p_trace)
    p_trace.add_argument("--out", default="trace.json", help="the trace file")
    p_trace.add_argument("--backend", default="threads", choices=("ray", "threads"), help="what runs the replicas")
    p_demo = sub.add_parser("demo", help="all-reduce and all-gather on 4 replicas under local Ray", **kw)
    p_demo.add_argument("--replicas", "-n", type=_positive_int, default=4, help="number of replicas")
    p_demo.add_argument("--backend", default="ray", choices=("ray", "threads"), help="what runs the replicas")
    add_cluster_parser(sub, **kw)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    started = time.time()
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line
            return _dispatch(ns)
    except (DeadlockError, CollectiveMismatchError) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        _trace_note(ns, started)
        return 3
    except ReplicasError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        _trace_note(ns, started)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the job was cancelled", file=sys.stderr)
        return 130


def _trace_note(ns: argparse.Namespace, started: float) -> None:
    """A failed job still wrote its trace (up to the failure): say where, as a clean run does."""
    path = ns.out if ns.command == "trace" else getattr(ns, "trace", None)
    try:
        written = path is not None and os.path.getmtime(path) >= started - 1
    except OSError:
        written = False
    if written:
        print(f"wrote {path}: the job up to its error (open it in https://ui.perfetto.dev)", file=sys.stderr)


def _warning_line(message: Warning | str, *_: Any, **__: Any) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _dispatch(ns: argparse.Namespace) -> int:
    import replicas as rp

    if ns.command == "cluster":
        return cluster_command(ns)
    if ns.command == "demo":
        text = DEMO_HLO.replace("replica_count=4", f"replica_count={ns.replicas}").replace(
            "f32[32]", f"f32[{8 * ns.replicas}]")
        module = rp.parse_hlo(text)
        print(module.to_hlo_text())
        x = np.arange(8, dtype=np.float32)
        print(f"running on {ns.replicas} replicas ({ns.backend}); replica r adds r to x = {x.tolist()}")
        results = rp.run(module, [x], num_replicas=ns.replicas, backend=ns.backend)
        for r, (total, gathered) in enumerate(results):
            print(f"replica {r}: all-reduce = {total.tolist()}")
            print(f"           all-gather = {gathered.tolist()}")
        return 0
    try:
        module = as_program(rp.load(ns.program, elided=ns.elided))  # JAX's lowered SPMD text: partitioned
    except ProgramError as e:
        if ns.command != "check":
            raise
        print(f"ProgramError: {e}")  # an invalid program is what `check` reports, before running anything
        return 2
    n = ns.replicas or declared_replicas(module)
    parameters = module.entry_computation.parameters
    args = load_args(ns.args, n, parameters)
    if args is None and parameters:
        if ns.command == "check" or ns.zeros:
            args = zero_arguments(module)
            if ns.command == "check":
                print("note: no --args given: every parameter is zeros")
        else:
            names = ", ".join(f"%{p.name} {p.shape}" for p in parameters)
            raise ProgramError(f"{ns.program} takes {len(parameters)} argument(s) ({names}) and no --args was "
                               f"given: pass --args args.npz (keys arg0, arg1, ...) or --zeros to give zeros")
    options = {"timeout": ns.timeout, "record_every_instruction": ns.trace_all, "trace_events": ns.trace_events,
               "progress": not ns.quiet}
    if ns.command == "check":
        from replicas.checker import describe, find_problem

        problem = find_problem(module, args, n, strict=not ns.lenient, trace=ns.trace, **options)
        if problem is None:
            print(f"ok: {Path(ns.program).name} ran on {n} replicas with no deadlock, mismatch or error")
            return 0
        print(describe(problem))
        return 3 if isinstance(problem, (DeadlockError, CollectiveMismatchError)) else 2
    if ns.command == "trace":
        rp.run(module, args, num_replicas=n, trace=ns.out, backend=ns.backend, **options)
        print(f"wrote {ns.out} (open it in https://ui.perfetto.dev)")
        return 0
    results = rp.run(module, args, num_replicas=n, address=ns.address, trace=ns.trace, backend=ns.backend,
                     **options)
    for r, value in enumerate(results):
        print(f"replica {r}: {summarize(value)}")
    if ns.out:
        save_results(ns.out, results)
        print(f"saved {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
