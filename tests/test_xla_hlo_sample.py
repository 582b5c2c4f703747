"""XLA's own .hlo test files (a sample in tests/xla_hlo_sample, see its NOTICE) parse and run, and
what XLA's parser accepts besides: no HloModule line, elided constants, f4e2m1fn."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from xla_oracle import jax_text, jit_answer

import replicas as rp
from replicas.shapes import Shape

SAMPLE = pathlib.Path(__file__).parent / "xla_hlo_sample"
MODULES = [(path.name, k, text) for path in sorted(SAMPLE.glob("*.hlo"))
           for k, text in enumerate(path.read_text().split("// -----"))]


def _argument(shape: Shape, rng: np.random.Generator):
    if shape.is_tuple:
        return tuple(_argument(s, rng) for s in shape.tuple_shapes)
    if shape.is_token:
        return rp.TOKEN
    return np.asarray(rng.integers(0, 4, size=shape.dimensions)).astype(shape.dtype)


def test_the_sample_is_broad():
    assert len(MODULES) >= 25


@pytest.mark.parametrize("name,k,text", MODULES, ids=[f"{n}:{k}" for n, k, _ in MODULES])
def test_xla_test_module_parses_and_runs(name, k, text):
    module = rp.parse_hlo(text)
    rng = np.random.default_rng(k)
    args = [_argument(p.shape, rng) for p in module.entry_computation.parameters]
    replicas = 2 if "replica-id" in text else 1
    results = rp.run(module, args, num_replicas=replicas, backend="threads")
    assert len(results) == replicas


BARE = """
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

main {
  w = f32[3,4] constant({...})
  z = f32[] constant(0)
  ROOT r = f32[3] reduce(w, z), dimensions={1}, to_apply=add
}
"""


def test_without_hloModule_line_the_last_computation_is_the_entry():
    module = rp.parse_hlo(BARE.replace("{...}", "{{1,2,3,4},{0,0,0,1},{2,2,2,2}}"))
    assert module.entry == "main"
    np.testing.assert_array_equal(rp.evaluate(module), [10, 1, 8])


def test_elided_constants_are_refused_by_default_naming_the_option():
    with pytest.raises(rp.ProgramError, match="elided='zeros'"):
        rp.parse_hlo(BARE)


def test_elided_constants_run_as_zeros_or_fixed_random_values():
    np.testing.assert_array_equal(rp.evaluate(rp.parse_hlo(BARE, elided="zeros")), [0, 0, 0])
    first = rp.evaluate(rp.parse_hlo(BARE, elided="random"))
    again = rp.evaluate(rp.parse_hlo(BARE, elided="random"))
    assert np.all(first != 0) and np.array_equal(first, again)
    with pytest.raises(rp.ProgramError, match="elided must be one of"):
        rp.parse_hlo(BARE, elided="ones")


def test_cli_takes_elided(tmp_path, capsys):
    from replicas.cli import main

    path = tmp_path / "bare.hlo"
    path.write_text(BARE)
    assert main(["run", str(path), "-n", "1", "--backend", "threads", "--elided", "zeros"]) == 0
    assert "0." in capsys.readouterr().out
    assert main(["run", str(path), "-n", "1", "--backend", "threads"]) == 2
    assert "--elided" in capsys.readouterr().err


def test_f4e2m1fn_converts_and_computes_like_jax():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = np.linspace(-8, 8, 41).astype(np.float32)
    f = lambda v: (v.astype(jnp.float4_e2m1fn) * v.astype(jnp.float4_e2m1fn)).astype(jnp.float32)  # noqa: E731
    text = jax_text(f, [x])
    assert "f4e2m1fn" in text
    got = rp.run(rp.parse_hlo(text), [x], num_replicas=1, backend="threads")[0]
    np.testing.assert_array_equal(got, jit_answer(f, [x])[0])
