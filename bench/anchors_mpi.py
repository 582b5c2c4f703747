"""The MPI anchor (mpi4py on numpy buffers), run under mpiexec; rank 0 prints one JSON line.

    mpiexec -n 4 python bench/anchors_mpi.py --ops all-reduce,all-gather --sizes 4096,1048576
    mpiexec -n 2 python bench/anchors_mpi.py --pingpong --sizes 4096,67108864

Collectives: Allreduce, Allgather, Reduce_scatter_block, Alltoall, and Sendrecv around a ring for
collective-permute, on an f32 buffer of the given bytes per rank (the same per-replica input as
bench/collectives.py). Reported per op and size: seconds per operation, the max over ranks of the
median of timed batches. --pingpong: rank 0 Sendrecv... rank 1 echoes; one round trip per iteration.
Prints {"skipped": ...} when mpi4py is missing.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def iterations(nbytes: int) -> int:
    if nbytes <= 64 * 1024:
        return 500
    if nbytes <= 2 << 20:
        return 40
    if nbytes <= 16 << 20:
        return 8
    return 4


def time_collective(comm, op: str, nbytes: int) -> float:
    from mpi4py import MPI

    n, rank = comm.Get_size(), comm.Get_rank()
    x = np.ones(nbytes // 4, np.float32)
    if op == "all-reduce":
        out = np.empty_like(x)
        call = lambda: comm.Allreduce(x, out, op=MPI.SUM)  # noqa: E731
    elif op == "all-gather":
        out = np.empty(x.size * n, np.float32)
        call = lambda: comm.Allgather(x, out)  # noqa: E731
    elif op == "reduce-scatter":
        out = np.empty(x.size // n, np.float32)
        call = lambda: comm.Reduce_scatter_block(x, out, op=MPI.SUM)  # noqa: E731
    elif op == "all-to-all":
        out = np.empty_like(x)
        call = lambda: comm.Alltoall(x, out)  # noqa: E731
    elif op == "collective-permute":
        out = np.empty_like(x)
        dest, source = (rank + 1) % n, (rank - 1) % n
        call = lambda: comm.Sendrecv(x, dest=dest, recvbuf=out, source=source)  # noqa: E731
    else:
        raise ValueError(op)
    k = iterations(nbytes)
    call()
    batches = []
    for _ in range(3):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            call()
        batches.append((time.perf_counter() - t0) / k)
    return float(comm.allreduce(float(np.median(batches)), op=MPI.MAX))


def time_pingpong(comm, nbytes: int) -> float:
    """Seconds per round trip 0 -> 1 -> 0 of an nbytes buffer."""
    rank = comm.Get_rank()
    x = np.ones(nbytes // 4, np.float32)
    back = np.empty_like(x)
    k = iterations(nbytes)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(k + 1):
        if _ == 1:
            t0 = time.perf_counter()
        if rank == 0:
            comm.Send(x, dest=1)
            comm.Recv(back, source=1)
        elif rank == 1:
            comm.Recv(back, source=0)
            comm.Send(back, dest=0)
    return (time.perf_counter() - t0) / k


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="all-reduce")
    parser.add_argument("--sizes", default="4096")
    parser.add_argument("--pingpong", action="store_true")
    a = parser.parse_args()
    try:
        from mpi4py import MPI
    except ImportError:
        print(json.dumps({"skipped": "not installed"}))
        return
    comm = MPI.COMM_WORLD
    sizes = [int(s) for s in a.sizes.split(",")]
    results: dict[str, dict[str, float]] = {}
    if a.pingpong:
        results["pingpong"] = {str(s): time_pingpong(comm, s) for s in sizes}
    else:
        for op in a.ops.split(","):
            results[op] = {str(s): time_collective(comm, op, s) for s in sizes}
    if comm.Get_rank() == 0:
        print(json.dumps({"ranks": comm.Get_size(), "mpi": MPI.Get_library_version().splitlines()[0],
                          "results": results}), flush=True)


if __name__ == "__main__":
    main()
