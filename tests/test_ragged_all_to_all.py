"""ragged-all-to-all against a numpy reference and XLA's own expected values (JAX's
ragged_collective_test, whose XLA:CPU has no kernel for it), its errors, and one run under Ray."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replicas as rp
from replicas.errors import ProgramError


def program(n: int, input_shape: str, output_shape: str, updates: int, dtype: str = "s32",
            groups: str = "{}", recv_updates: int | None = None) -> rp.Module:
    rows = f"{dtype}[{input_shape}]"
    out = f"{dtype}[{output_shape}]"
    attrs = f"replica_groups={groups}"
    return rp.parse_hlo(f"""HloModule ragged, replica_count={n}

ENTRY main {{
  data = {rows} parameter(0)
  output = {out} parameter(1)
  input_offsets = s32[{updates}] parameter(2)
  send_sizes = s32[{updates}] parameter(3)
  output_offsets = s32[{updates}] parameter(4)
  recv_sizes = s32[{recv_updates or updates}] parameter(5)
  ROOT r = {out} ragged-all-to-all(data, output, input_offsets, send_sizes, output_offsets, recv_sizes), {attrs}
}}
""")


def reference(groups: list[list[int]], args: list[list[np.ndarray]]) -> list[np.ndarray]:
    """The semantics written out: member j's entry e = k * U + u sends its rows to member k's output."""
    outs = [a[1].copy() for a in args]
    for group in groups:
        n = len(group)
        for src in group:
            data, _, offsets_in, sizes, offsets_out, _ = args[src]
            per_peer = len(sizes) // n
            for k, dst in enumerate(group):
                for u in range(per_peer):
                    e = k * per_peer + u
                    outs[dst][offsets_out[e]:offsets_out[e] + sizes[e]] = data[offsets_in[e]:offsets_in[e] + sizes[e]]
    return outs


def as_args(*columns: list) -> list[list[np.ndarray]]:
    """Per replica: (input, output, input_offsets, send_sizes, output_offsets, recv_sizes)."""
    return [[np.asarray(c[r], np.int32) for c in columns] for r in range(len(columns[0]))]


def test_xla_examples() -> None:
    # JAX's test_ragged_all_to_all: two replicas, one update per peer.
    args = as_args([[1, 2, 2], [3, 4, 0]], [[0] * 4] * 2, [[0, 1], [0, 1]], [[1, 2], [1, 1]], [[0, 0], [1, 2]],
                   [[1, 1], [2, 1]])
    out = rp.run(program(2, "3", "4", 2), args, backend="threads")
    assert [o.tolist() for o in out] == [[1, 3, 0, 0], [2, 2, 4, 0]]
    # ... with axis_index_groups ((0, 1), (2, 3)).
    args = as_args([[1, 2, 2], [3, 4, 0], [10, 20, 20], [30, 40, 0]], [[0] * 4] * 4, [[0, 1]] * 4,
                   [[1, 2], [1, 1]] * 2, [[0, 0], [1, 2]] * 2, [[1, 1], [2, 1]] * 2)
    out = rp.run(program(4, "3", "4", 2, groups="{{0,1},{2,3}}"), args, backend="threads")
    assert [o.tolist() for o in out] == [[1, 3, 0, 0], [2, 2, 4, 0], [10, 30, 0, 0], [20, 20, 40, 0]]
    # ... with singleton groups: each replica writes into its own output.
    args = as_args([[1, 0, 0, 0], [2, 3, 4, 0]], [[0] * 4] * 2, [[0], [0]], [[1], [3]], [[2], [1]], [[1], [3]])
    out = rp.run(program(2, "4", "4", 1, groups="{{0},{1}}"), args, backend="threads")
    assert [o.tolist() for o in out] == [[0, 0, 1, 0], [0, 2, 3, 4]]


@st.composite
def exchanges(draw: st.DrawFn) -> tuple[int, int, int, list[list[np.ndarray]]]:
    """A consistent exchange: n members, U updates per peer, blocks of 2-element rows."""
    n = draw(st.integers(1, 4))
    per_peer = draw(st.integers(1, 3))
    rows_in, rows_out = draw(st.integers(0, 6)), draw(st.integers(1, 8))
    sizes = [[draw(st.integers(0, min(rows_in, rows_out))) for _ in range(n * per_peer)] for _ in range(n)]
    offsets_in = [[draw(st.integers(0, rows_in - s)) for s in row] for row in sizes]
    offsets_out = [[draw(st.integers(0, rows_out - s)) for s in row] for row in sizes]
    recv = [[sizes[j][k * per_peer + u] for j in range(n) for u in range(per_peer)] for k in range(n)]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    data = [rng.integers(-100, 100, (rows_in, 2)) for _ in range(n)]
    outputs = [rng.integers(-100, 100, (rows_out, 2)) for _ in range(n)]
    return n, rows_in, rows_out, as_args(data, outputs, offsets_in, sizes, offsets_out, recv)


@settings(max_examples=25, deadline=None)
@given(exchanges())
def test_matches_the_reference(case: tuple[int, int, int, list[list[np.ndarray]]]) -> None:
    n, rows_in, rows_out, args = case
    module = program(n, f"{rows_in},2", f"{rows_out},2", len(args[0][2]))
    out = rp.run(module, args, backend="threads")
    for got, want in zip(out, reference([list(range(n))], args)):
        np.testing.assert_array_equal(got, want)


def test_bad_entries_name_the_replica_and_the_entry() -> None:
    good = as_args([[1, 2, 2], [3, 4, 0]], [[0] * 4] * 2, [[0, 1], [0, 1]], [[1, 2], [1, 1]], [[0, 0], [1, 2]],
                   [[1, 1], [2, 1]])
    module = program(2, "3", "4", 2)

    def run_with(replica: int, column: int, values: list[int]) -> None:
        args = [list(a) for a in good]
        args[replica][column] = np.asarray(values, np.int32)
        rp.run(module, args, backend="threads")

    with pytest.raises(ProgramError, match=r"replica 1 sends 1 rows as its update 0 to replica 0, whose "
                                           r"recv_sizes\[1\] = 2"):
        run_with(0, 5, [1, 2])
    with pytest.raises(ProgramError, match=r"on replica 1: input_offsets\[1\] = 3 and send_sizes\[1\] = 1 reach "
                                           r"past the input's 3 rows"):
        run_with(1, 2, [0, 3])
    with pytest.raises(ProgramError, match=r"on replica 0: send_sizes\[0\] = -1 is negative"):
        run_with(0, 3, [-1, 2])
    with pytest.raises(ProgramError, match=r"replica 0's output_offsets\[1\] = 3 and its 2 rows reach past "
                                           r"replica 1's output of 4 rows"):
        run_with(0, 4, [0, 3])
    with pytest.raises(ProgramError, match="cannot be split among the group's 2 members"):
        rp.run(program(2, "3", "4", 3), [[a[0], a[1], *(np.zeros(3, np.int32),) * 4] for a in good], backend="threads")
    with pytest.raises(ProgramError, match="must be a 1-D integer array"):
        rp.run(program(2, "3", "4", 2, recv_updates=3), good, backend="threads")


@pytest.mark.usefixtures("ray_session")
def test_under_ray_across_actors() -> None:
    rng = np.random.default_rng(7)
    n, per_peer, rows = 4, 2, 6
    sizes = rng.integers(0, 3, (n, n * per_peer))
    offsets_in = [[int(rng.integers(0, rows - s + 1)) for s in row] for row in sizes]
    offsets_out = [[int(rng.integers(0, rows - s + 1)) for s in row] for row in sizes]
    recv = [[sizes[j][k * per_peer + u] for j in range(n) for u in range(per_peer)] for k in range(n)]
    data = [rng.standard_normal((rows, 3)).astype(np.float32) for _ in range(n)]
    outputs = [np.full((rows, 3), -1, np.float32) for _ in range(n)]
    args = [[data[r], outputs[r], *(np.asarray(c[r], np.int32) for c in (offsets_in, sizes, offsets_out, recv))]
            for r in range(n)]
    module = program(n, f"{rows},3", f"{rows},3", n * per_peer, dtype="f32")
    out = rp.run(module, args, replicas_per_actor=2)
    for got, want in zip(out, reference([list(range(n))], args)):
        np.testing.assert_array_equal(got, want)
