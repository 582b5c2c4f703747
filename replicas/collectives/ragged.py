"""ragged-all-to-all: an all-to-all of variable-sized row blocks, written into a given output.

XLA's semantics (its GPU runtime; XLA:CPU has no kernel for it, so JAX on CPU cannot run it):
operands `(input, output, input_offsets, send_sizes, output_offsets, recv_sizes)`, the last four
1-D integer arrays of `num_updates = group size x U` entries. Update `u` to the member at group
position `j` is entry `j * U + u`: rows `[input_offsets[e], input_offsets[e] + send_sizes[e])` of
dimension 0 of this member's input are written to rows starting at `output_offsets[e]` of that
member's output (the offset is the receiver's). `recv_sizes[j * U + u]` is what this member receives
as update `u` from member `j`. The result is `output` with every received block written in (group
order, then update order); its other rows keep the operand's values.

Where XLA leaves an inconsistent program undefined (a block outside either array, a negative
size, a receiver expecting another size than its sender sends), this raises a ProgramError naming
the instruction, the replicas and the entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.collectives import algorithms as alg
from replicas.collectives.kernels import _bind
from replicas.hlo.ir import Instruction
from replicas.ops.registry import KernelContext, kernel

_NAMES = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")


@kernel("ragged-all-to-all")
def make_ragged_all_to_all(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    shapes = ctx.operand_shapes(inst)
    plan, coll = _bind(inst, ctx)
    assert plan is not None
    n = plan.size
    num_updates = shapes[2].dimensions[0]  # the shape rule checked: four 1-D arrays of one length
    if num_updates % n:
        raise inst.error(f"ragged-all-to-all: {num_updates} updates cannot be split among the group's {n} members "
                         "(num_updates must be a multiple of the group size)")
    per_peer = num_updates // n
    rows_in, rows_out = shapes[0].dimensions[0], shapes[1].dimensions[0]
    me, me_position, group = ctx.replica_id, plan.index, plan.group

    def entry(table: np.ndarray, j: int, u: int, name: str) -> str:
        return f"{name}[{j * per_peer + u}] = {int(table[j, u])}"

    def ragged_all_to_all(data: np.ndarray, output: np.ndarray, *tables: np.ndarray) -> np.ndarray:
        # Copies (of s64 tables too): receivers read the offsets and sizes sent them after this member went on.
        offsets_in, sizes, offsets_out, expected = (np.array(t, np.int64).reshape(n, per_peer) for t in tables)
        for table, name in zip((offsets_in, sizes, offsets_out, expected), _NAMES):
            if (table < 0).any():
                j, u = np.argwhere(table < 0)[0]
                raise inst.error(f"ragged-all-to-all on replica {me}: {entry(table, j, u, name)} is negative")
        beyond = offsets_in + sizes > rows_in
        if beyond.any():
            j, u = np.argwhere(beyond)[0]
            raise inst.error(f"ragged-all-to-all on replica {me}: {entry(offsets_in, j, u, 'input_offsets')} and "
                             f"{entry(sizes, j, u, 'send_sizes')} reach past the input's {rows_in} rows")
        # Copies, not views: a receiver reads its blocks after this member has gone on, and may
        # meanwhile update its input in place.
        payloads = tuple((tuple(data[a:a + s].copy() for a, s in zip(offsets_in[j], sizes[j])), offsets_out[j],
                          sizes[j]) for j in range(n))
        received = coll.run(alg.all_to_all_tuple, payloads)
        out = np.array(output, copy=True)
        for j, (blocks, at, got) in enumerate(received):
            source = group[j]
            for u in range(per_peer):
                if got[u] != expected[j, u]:
                    raise inst.error(f"ragged-all-to-all: replica {source} sends {int(got[u])} rows as its update {u} "
                                     f"to replica {me}, whose {entry(expected, j, u, 'recv_sizes')}")
                if at[u] + got[u] > rows_out:
                    index = me_position * per_peer + u
                    raise inst.error(f"ragged-all-to-all: replica {source}'s output_offsets[{index}] = {int(at[u])} "
                                     f"and its {int(got[u])} rows reach past replica {me}'s output of {rows_out} rows")
                out[at[u]:at[u] + got[u]] = blocks[u]
        return out

    return ragged_all_to_all
