"""Hostile input, fuzzed: mutations of valid HLO text, .msgpack modules, rp.run arguments and the
CLI's .npz files raise only ProgramError (never RecursionError, MemoryError, KeyError, a crash or a
hang) and allocate at most a fixed budget. Every input that ever failed is kept in
tests/fuzz_corpus/ and replayed first. REPLICAS_FUZZ_SCALE=10 runs ten times the examples.

No code path evaluates, unpickles or imports anything a file names: checked with an audit hook.
"""

from __future__ import annotations

import gzip
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from fuzzkit import (
    CORPUS,
    HLO_SEEDS,
    body_of,
    flip_bytes,
    mutate_object,
    mutate_text,
    npz_bytes,
    run_target,
    with_body,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replicas as rp
from replicas.hlo.msgpack_bounds import DECODE_EXPANSION
from replicas.hlo.msgpack_bounds import ModuleReader as _ModuleReader
from replicas.hlo.serialize import module_from_bytes, module_to_bytes
from replicas.limits import check_module
from replicas.runtime.compile import compile_module
from replicas.runtime.job import prepare

SCALE = float(os.environ.get("REPLICAS_FUZZ_SCALE", "1"))
# The suite's runs are reproducible (the same examples every run, so a red run is a real finding,
# not luck); REPLICAS_FUZZ_RANDOM=1 explores new examples, and what they find joins the corpus.
EXPLORE = os.environ.get("REPLICAS_FUZZ_RANDOM") == "1"
RAN: dict[str, int] = {}  # examples run per fuzz test (printed with -s)


def fuzz(name: str, examples: int, body, **strategies) -> None:
    """Run `body(**example)` on the first `examples` (times REPLICAS_FUZZ_SCALE) hypothesis examples.

    A count, not a time: the same examples on every machine and every run, and a loaded machine
    no longer runs fewer. The time budgets (2-5 s, up to 1000-2000 examples) ran 55-430 per test
    on a loaded 2-core machine and more on a quiet one (12-19 CPU s in all), the first 10 twice;
    the counts are about the loaded machine's (~6 CPU s in all). REPLICAS_FUZZ_SCALE=10 or
    REPLICAS_FUZZ_RANDOM=1 explores further."""

    @settings(max_examples=max(1, int(examples * SCALE)), deadline=None, database=None, derandomize=not EXPLORE,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(**strategies)
    def run(**example):
        RAN[name] = RAN.get(name, 0) + 1
        body(**example)

    run()


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    print("\nfuzz examples run:", RAN)


# -- targets ---------------------------------------------------------------------------------------

def parse_target(text: str) -> None:
    module = rp.parse_hlo(text)
    compile_module(module)


def msgpack_target(data: bytes) -> None:
    module = module_from_bytes(data)
    check_module(module)  # what rp.load adds
    compile_module(module)


def npz_target(data: bytes) -> None:
    from replicas.cli import load_args

    with tempfile.NamedTemporaryFile(suffix=".npz") as f:
        f.write(data)
        f.flush()
        load_args(f.name, 2, _ARGS_MODULE.entry_computation.parameters)


_ARGS_MODULE = rp.parse_hlo("""HloModule args, replica_count=2

ENTRY main {
  x = f32[4] parameter(0)
  t = (s32[2], pred[]) parameter(1)
  i = s32[2] get-tuple-element(t), index=0
  ROOT y = f32[4] add(x, x)
}
""")
_SEED_MSGPACK = [module_to_bytes(rp.parse_hlo(text, verify=False)) for text in HLO_SEEDS]
_SEED_NPZ = [npz_bytes({"arg0": np.zeros(4, np.float32), "arg1": np.ones(2, np.int32)}, c) for c in (False, True)]


# -- the stored corpus, replayed every run -------------------------------------------------------------

TARGETS = {".hlo": lambda b: parse_target(b.decode("utf-8", "surrogateescape")), ".msgpack": msgpack_target,
           ".npz": npz_target}


# Bytes allocated per input byte: HLO text is parsed within 10; a .msgpack module's decoded objects
# are refused past their budget; .npz members are bounded by their declared sizes.
PER_BYTE = {".hlo": 10, ".msgpack": _ModuleReader.BUDGET_PER_BYTE + 1, ".npz": DECODE_EXPANSION}
ALLOWANCE = {".hlo": 0, ".msgpack": _ModuleReader.BUDGET_FLOOR, ".npz": 0}


def bounded(path_kind: str) -> dict[str, int]:
    return {"per_byte": PER_BYTE[path_kind], "allowance": ALLOWANCE[path_kind]}


def kind(path: Path) -> str:
    """A corpus file's kind: its suffix (before ".gz": large inputs are stored compressed)."""
    return Path(path.stem).suffix if path.suffix == ".gz" else path.suffix


def content(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


CORPUS_FILES = sorted(p for p in CORPUS.glob("*") if kind(p) in TARGETS)


def test_the_corpus_is_not_empty():
    assert {kind(p) for p in CORPUS_FILES} == set(TARGETS)


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_corpus_input_raises_only_program_error(path: Path):
    run_target(TARGETS[kind(path)], content(path), str(path.name), **bounded(kind(path)))


SMALL_CORPUS_FILES = [p for p in CORPUS_FILES if p.suffix != ".gz"]  # the large ones are replayed once, above


def test_the_corpus_through_rp_load():
    for path in SMALL_CORPUS_FILES:
        if kind(path) in (".hlo", ".msgpack"):
            run_target(rp.load, path, path.name, **bounded(kind(path)))


def test_decoding_a_module_holds_at_most_its_expansion_and_a_larger_input_is_refused_up_front(tmp_path):
    from replicas.limits import configure, restore

    empty_maps = with_body({"computations": [{}] * 100_000})  # the worst case: one byte per 64-byte dict
    run_target(msgpack_target, empty_maps, "a run of empty maps")  # within DECODE_EXPANSION per byte
    previous = configure(max_bytes=len(empty_maps) * 10)
    try:
        path = tmp_path / "maps.msgpack"
        path.write_bytes(empty_maps)
        with pytest.raises(rp.ProgramError, match="may take up to .* to decode, more than the ceiling"):
            rp.load(path)
    finally:
        restore(previous)


# -- fuzzing -------------------------------------------------------------------------------------------

text_ops = st.lists(st.tuples(st.sampled_from(["drop", "dup", "swap", "number", "shape", "attribute", "insert",
                                                "truncate", "flip"]),
                              st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)),
                    min_size=1, max_size=5)


def test_fuzz_hlo_text():
    fuzz("hlo text", 150, lambda seed, ops: run_target(parse_target, mutate_text(HLO_SEEDS[seed], ops),
                                                       "HLO text", **bounded(".hlo")),
         seed=st.sampled_from(range(len(HLO_SEEDS))), ops=text_ops)


object_ops = st.lists(st.tuples(st.sampled_from(["replace", "nest", "drop", "grow"]), st.integers(0, 10**6),
                                st.integers(0, 10**6)), min_size=1, max_size=4)
byte_ops = st.lists(st.tuples(st.sampled_from(["flip", "set", "truncate", "insert"]), st.integers(0, 10**6),
                              st.integers(0, 10**6)), min_size=1, max_size=6)


def _structure(seed: int, ops: list) -> None:
    body = mutate_object(body_of(_SEED_MSGPACK[seed]), ops)
    try:
        data = with_body(body)
    except (OverflowError, ValueError, TypeError):  # msgpack cannot even write it
        return
    run_target(msgpack_target, data, "msgpack module")


def test_fuzz_msgpack_structure():
    fuzz("msgpack structure", 250, _structure, seed=st.sampled_from(range(len(HLO_SEEDS))), ops=object_ops)


def test_fuzz_msgpack_bytes():
    fuzz("msgpack bytes", 300, lambda seed, ops: run_target(msgpack_target, flip_bytes(_SEED_MSGPACK[seed], ops),
                                                            "msgpack bytes"),
         seed=st.sampled_from(range(len(HLO_SEEDS))), ops=byte_ops)


def test_fuzz_npz_bytes():
    fuzz("npz bytes", 150, lambda seed, ops: run_target(npz_target, flip_bytes(_SEED_NPZ[seed], ops), ".npz bytes"),
         seed=st.sampled_from(range(len(_SEED_NPZ))), ops=byte_ops)


_dtypes = st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.bool_, np.uint8, np.complex64, object])
_arrays = st.builds(lambda dt, shape: np.zeros(shape, dtype=dt), _dtypes,
                    st.lists(st.integers(0, 5), max_size=3).map(tuple))
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.complex_numbers(),
                     st.text(max_size=5), st.binary(max_size=5))
_values = st.recursive(st.one_of(_scalars, _arrays),
                       lambda inner: st.one_of(st.lists(inner, max_size=5), st.tuples(inner, inner),
                                               st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                       max_leaves=12)
_counts = st.one_of(st.integers(-3, 5), st.just(2**70), st.none(), st.floats(), st.text(max_size=3))


def test_fuzz_run_arguments():
    fuzz("rp.run arguments", 80,
         lambda args, n: run_target(lambda a: prepare(_ARGS_MODULE, a, n), args, "rp.run arguments"),
         args=st.one_of(_values, st.lists(_values, max_size=4)), n=_counts)


# -- nothing named by a file is evaluated, unpickled or imported --------------------------------------------

MARKER = "replicas_fuzz_marker_module"
HOSTILE_HLO = f"""HloModule {MARKER}, replica_count=2

ENTRY main {{
  x = f32[4] parameter(0)
  y = f32[4] custom-call(x), custom_call_target="{MARKER}.system", backend_config="__import__('{MARKER}')"
  ROOT z = f32[4] add(y, y), metadata={{op_name="{MARKER}" source_file="{MARKER}.py"}}
}}
"""


def test_nothing_a_file_names_is_evaluated_unpickled_or_imported(tmp_path):
    events: list[tuple[str, tuple]] = []
    watching = [True]

    def hook(event: str, args: tuple) -> None:
        if watching[0] and event in ("import", "exec", "compile", "pickle.find_class", "os.system",
                                     "subprocess.Popen", "builtins.input", "ctypes.dlopen"):
            events.append((event, args))

    sys.addaudithook(hook)  # audit hooks cannot be removed: this one only records while watching
    try:
        text_path = tmp_path / "hostile.hlo"
        text_path.write_text(HOSTILE_HLO)
        module = rp.load(text_path)
        binary = tmp_path / "hostile.msgpack"
        rp.save(module, binary)
        loaded = rp.load(binary)
        with pytest.raises(rp.ProgramError, match="unknown custom-call target"):
            rp.run(loaded, [np.zeros(4, np.float32)], num_replicas=2, backend="threads")
        for corpus in SMALL_CORPUS_FILES:
            try:
                TARGETS[kind(corpus)](corpus.read_bytes())
            except rp.ProgramError:
                pass
    finally:
        watching[0] = False
    named = [(e, a) for e, a in events if MARKER in repr(a)[:100000] and e != "compile"
             or e == "compile" and MARKER in repr(a[0])[:100000]]
    assert not named, named[:3]
    assert not [e for e, _ in events if e in ("pickle.find_class", "os.system", "subprocess.Popen")]
    assert MARKER not in sys.modules


def _repeated(seed: int, start: int, length: int, copies: int) -> str:
    """A slice of a seed repeated in place, so the text stays mostly well-formed and grows large."""
    text = HLO_SEEDS[seed]
    start %= len(text)
    piece = text[start:start + 1 + length % 64]
    return text[:start] + piece * copies + text[start:]


def test_fuzz_large_repetitive_hlo_text_stays_within_ten_bytes_per_input_byte():
    fuzz("repetitive hlo text", 12,
         lambda seed, start, length, copies: run_target(parse_target, _repeated(seed, start, length, copies),
                                                        "repetitive HLO text", **bounded(".hlo")),
         seed=st.sampled_from(range(len(HLO_SEEDS))), start=st.integers(0, 10**6), length=st.integers(0, 63),
         copies=st.integers(1000, 8000))


def _numbered(seed: int, pick: int, copies: int) -> str:
    """An instruction of a seed repeated `copies` times under new names (`name.rK`) right after it:
    a large program of distinct instructions, mostly valid (a repeated parameter is not)."""
    import re

    lines = HLO_SEEDS[seed].split("\n")
    candidates = [i for i, line in enumerate(lines) if re.match(r"\s+%?[\w.\-]+ = ", line)]
    i = candidates[pick % len(candidates)]
    name = re.match(r"\s+%?([\w.\-]+) = ", lines[i]).group(1)
    copies_text = [lines[i].replace(name, f"{name}.r{k}", 1) for k in range(copies)]
    return "\n".join(lines[:i + 1] + copies_text + lines[i + 1:])


def test_fuzz_large_repetitive_hlo_text_of_megabytes():
    # Inputs of megabytes (the repetitive test above stays under one): a seed's slice repeated, or
    # one of its instructions repeated under fresh names (a large program the parser must hold).
    # The budget is per input byte, so a parser holding a constant factor more shows here.
    def body(seed, start, length, copies, numbered):
        text = _numbered(seed, start, copies // 4) if numbered else _repeated(seed, start, length, copies)
        run_target(parse_target, text, "large repetitive HLO text", **bounded(".hlo"))

    fuzz("large repetitive hlo text", 4, body, seed=st.sampled_from(range(len(HLO_SEEDS))),
         start=st.integers(0, 10**6), length=st.integers(16, 63), copies=st.integers(40_000, 80_000),
         numbered=st.booleans())
