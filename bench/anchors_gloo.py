"""The torch.distributed gloo anchor: N processes (torch.multiprocessing), rank 0 prints one JSON line.

    python bench/anchors_gloo.py --replicas 4 --ops all-reduce,all-gather --sizes 4096,1048576
    python bench/anchors_gloo.py --replicas 4 --rank R --master HOST:PORT ...   # one rank (one per host)

Ops: all_reduce, all_gather_into_tensor (falls back to all_gather), reduce_scatter_tensor,
all_to_all_single, and isend/irecv around a ring for collective-permute, on an f32 tensor of the
given bytes per rank. An op gloo does not implement is reported as null with its error. Seconds
per op: the max over ranks of the median of timed batches. Prints {"skipped": ...} without torch.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _iterations(nbytes: int) -> int:
    if nbytes <= 64 * 1024:
        return 100
    if nbytes <= 2 << 20:
        return 20
    if nbytes <= 16 << 20:
        return 5
    return 3


def _call(op: str, x, n: int, rank: int):
    import torch
    import torch.distributed as dist

    if op == "all-reduce":
        out = x.clone()
        return lambda: dist.all_reduce(out)
    if op == "all-gather":
        out = torch.empty(x.numel() * n, dtype=x.dtype)
        if hasattr(dist, "all_gather_into_tensor"):
            return lambda: dist.all_gather_into_tensor(out, x)
        parts = list(out.chunk(n))
        return lambda: dist.all_gather(parts, x)
    if op == "reduce-scatter":
        out = torch.empty(x.numel() // n, dtype=x.dtype)
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: rs(out, x)
    if op == "all-to-all":
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x)
    if op == "collective-permute":
        out = torch.empty_like(x)
        dest, source = (rank + 1) % n, (rank - 1) % n

        def permute() -> None:
            reqs = [dist.isend(x, dest), dist.irecv(out, source)]
            for r in reqs:
                r.wait()
        return permute
    raise ValueError(op)


def _worker(rank: int, n: int, port: int, ops: list[str], sizes: list[int], queue, master: str = "127.0.0.1") -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = master
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    results: dict[str, dict[str, float | None]] = {}
    errors: dict[str, str] = {}
    for op in ops:
        results[op] = {}
        for nbytes in sizes:
            x = torch.ones(nbytes // 4, dtype=torch.float32)
            try:
                call = _call(op, x, n, rank)
                call()
                k = _iterations(nbytes)
                batches = []
                for _ in range(3):
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(k):
                        call()
                    batches.append((time.perf_counter() - t0) / k)
                batches.sort()
                mine = torch.tensor([batches[1]], dtype=torch.float64)
                dist.all_reduce(mine, op=dist.ReduceOp.MAX)
                results[op][str(nbytes)] = float(mine.item())
            except Exception as e:  # noqa: BLE001 - an op gloo lacks is reported, not fatal
                results[op][str(nbytes)] = None
                errors[op] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                dist.barrier()
    if rank == 0:
        report = {"ranks": n, "torch": torch.__version__, "results": results, "errors": errors}
        if queue is None:
            print(json.dumps(report), flush=True)
        else:
            queue.put(report)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--ops", default="all-reduce")
    parser.add_argument("--sizes", default="4096")
    parser.add_argument("--rank", type=int, help="run only this rank (started on its own host); rank 0 prints")
    parser.add_argument("--master", help="with --rank: rank 0's address:port")
    a = parser.parse_args()
    if a.rank is not None:
        host, port = a.master.rsplit(":", 1)
        _worker(a.rank, a.replicas, int(port), a.ops.split(","), [int(s) for s in a.sizes.split(",")], None, host)
        return
    try:
        import torch.multiprocessing as mp
    except ImportError:
        print(json.dumps({"skipped": "not installed"}))
        return
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    ops = a.ops.split(",")
    sizes = [int(s) for s in a.sizes.split(",")]
    procs = [ctx.Process(target=_worker, args=(r, a.replicas, port, ops, sizes, queue)) for r in range(a.replicas)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        print(f"gloo worker exit codes {[p.exitcode for p in procs]}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(queue.get()), flush=True)


if __name__ == "__main__":
    main()
