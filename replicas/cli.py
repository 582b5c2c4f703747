"""`replicas run | check | trace | demo`: the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from replicas.errors import CollectiveMismatchError, DeadlockError, ProgramError, ReplicasError

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


def load_args(path: str | None, num_replicas: int) -> list[list[Any]] | None:
    """An .npz of `arg0, arg1, ...` (every replica) or `r<R>_arg<I>` (per replica)."""
    if path is None:
        return None
    with np.load(path, allow_pickle=False) as data:
        keys = list(data.keys())
        if any(k.startswith("r") and "_arg" in k for k in keys):
            per = [[] for _ in range(num_replicas)]
            for r in range(num_replicas):
                i = 0
                while f"r{r}_arg{i}" in data:
                    per[r].append(data[f"r{r}_arg{i}"])
                    i += 1
            return per
        shared = []
        i = 0
        while f"arg{i}" in data:
            shared.append(data[f"arg{i}"])
            i += 1
        if len(shared) != len(keys):
            raise ReplicasError(f"{path}: expected keys arg0, arg1, ... or r<R>_arg<I>, got {keys}")
        return shared


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


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="an .hlo/.txt (HLO text) or .msgpack program")
    p.add_argument("--replicas", "-n", type=int, default=None, help="number of replicas (default: the module's)")
    p.add_argument("--args", default=None, help=".npz with arg0, arg1, ... or r<R>_arg<I>")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--elided", default="error", choices=("error", "zeros", "random"),
                   help="constants XLA printed as {...}: refuse (default), or fill with zeros / random values")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replicas", description="Run one XLA program on N replicas.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run a program on N replicas (Ray actors)")
    _common(p_run)
    p_run.add_argument("--address", default=None, help='Ray address ("auto", "ray://host:port")')
    p_run.add_argument("--out", default=None, help="save the results to this .npz")
    p_run.add_argument("--trace", default=None, help="write a Chrome trace-event file")
    p_run.add_argument("--backend", default="ray", choices=("ray", "threads"))
    p_check = sub.add_parser("check", help="run on N threads (no Ray) and report deadlocks and mismatches")
    _common(p_check)
    p_check.add_argument("--lenient", action="store_true",
                         help="pair different collective instructions of the same form (strict=False)")
    p_trace = sub.add_parser("trace", help="run and write a Chrome trace-event file (Perfetto)")
    _common(p_trace)
    p_trace.add_argument("--out", default="trace.json")
    p_trace.add_argument("--backend", default="threads", choices=("ray", "threads"))
    p_demo = sub.add_parser("demo", help="all-reduce and all-gather on 4 replicas under local Ray")
    p_demo.add_argument("--replicas", "-n", type=int, default=4)
    p_demo.add_argument("--backend", default="ray", choices=("ray", "threads"))
    ns = parser.parse_args(argv)
    try:
        return _dispatch(ns)
    except (DeadlockError, CollectiveMismatchError) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 3
    except ReplicasError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2


def _dispatch(ns: argparse.Namespace) -> int:
    import replicas as rp

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
        module = rp.load(ns.program, elided=ns.elided)
    except ProgramError as e:
        if ns.command != "check":
            raise
        print(f"ProgramError: {e}")  # an invalid program is what `check` reports, before running anything
        return 2
    n = ns.replicas or module.attrs.get("replica_count") or module.num_partitions or 1
    args = load_args(ns.args, n)
    if ns.command == "check":
        from replicas.diagnostics.check import check, describe

        if args is None and module.entry_computation.parameters:
            print("note: no --args given: every parameter is zeros")
        problem = check(module, args, n, timeout=ns.timeout, strict=not ns.lenient)
        if problem is None:
            print(f"ok: {Path(ns.program).name} ran on {n} replicas with no deadlock, mismatch or error")
            return 0
        print(describe(problem))
        return 3 if isinstance(problem, (DeadlockError, CollectiveMismatchError)) else 2
    if ns.command == "trace":
        rp.run(module, args, num_replicas=n, timeout=ns.timeout, trace=ns.out, backend=ns.backend)
        print(f"wrote {ns.out} (open it in https://ui.perfetto.dev)")
        return 0
    results = rp.run(module, args, num_replicas=n, timeout=ns.timeout, address=ns.address, trace=ns.trace,
                     backend=ns.backend)
    for r, value in enumerate(results):
        print(f"replica {r}: {summarize(value)}")
    if ns.out:
        save_results(ns.out, results)
        print(f"saved {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
