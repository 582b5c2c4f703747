"""Reports in the user's terms: every report, progress line, trace slice and error that names an
instruction also names its source (the module's `metadata`), and the report's small defects."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import replicas as rp
from replicas.cli import main as cli_main
from replicas.errors import CollectiveMismatchError, DeadlockError, ExecutionTimeout, ReplicaFailure
from replicas.hlo.source import SourceMap

sys.path.insert(0, str(Path(__file__).parent))
from buggy_programs import BY_NAME  # noqa: E402

# Newer JAX: a stack_frame_id into the module's tables; older: source_file/source_line inline.
FRAMES = """
FileNames
1 "/home/me/train.py"

FunctionNames
1 "step"

FileLocations
1 {file_name_id=1 function_name_id=1 line=42 end_line=42 column=8 end_column=9}
2 {file_name_id=1 function_name_id=1 line=40 end_line=40 column=8 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}
"""

PSUM_META = 'metadata={op_name="jit(step)/shard_map/psum" stack_frame_id=1}'
MODEL_META = 'metadata={op_name="jit(f)/psum" source_file="/src/model.py" source_line=%d}'
BODY_META = 'metadata={op_name="jit(step)/while/body/psum" stack_frame_id=1}'

ADD = """
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""

# Replica 0 skips the all-reduce the others run: a deadlock in %psum.
SKIPPED = f"""HloModule skipped, replica_count=2
{FRAMES}
{ADD}
on_zero {{
  p = f32[4] parameter(0)
  ROOT c = f32[4] copy(p)
}}

on_others {{
  p = f32[4] parameter(0)
  ROOT psum.7 = f32[4] all-reduce(p), replica_groups={{}}, to_apply=add, {PSUM_META}
}}

ENTRY main {{
  x = f32[4] parameter(0)
  id = u32[] replica-id()
  zero = u32[] constant(0)
  is_zero = pred[] compare(id, zero), direction=EQ
  r = f32[4] conditional(is_zero, x, x), true_computation=on_zero, false_computation=on_others
  ROOT out = f32[4] copy(r)
}}
"""

MISMATCH = f"""HloModule mismatch, replica_count=2
{ADD}
on_zero {{
  p = f32[4] parameter(0)
  ROOT ar_a = f32[4] all-reduce(p), replica_groups={{}}, to_apply=add, {MODEL_META % 7}
}}

on_others {{
  p = f32[2] slice(f32[4] parameter(0)), slice={{[0:2]}}
  ar_b = f32[2] all-reduce(p), replica_groups={{}}, to_apply=add, {MODEL_META % 9}
  ROOT twice = f32[4] concatenate(ar_b, ar_b), dimensions={{0}}
}}

ENTRY main {{
  x = f32[4] parameter(0)
  id = u32[] replica-id()
  zero = u32[] constant(0)
  is_zero = pred[] compare(id, zero), direction=EQ
  ROOT r = f32[4] conditional(is_zero, x, x), true_computation=on_zero, false_computation=on_others
}}
"""

RAISES = f"""HloModule raises, replica_count=2
{FRAMES}
ENTRY main {{
  x = f32[4] parameter(0)
  ROOT y = f32[4] custom-call(x), custom_call_target="h31b_boom", metadata={{op_name="jit(step)/loss" stack_frame_id=2}}
}}
"""

FOREVER = f"""HloModule forever, replica_count=2
{FRAMES}
{ADD}
cond {{
  p = f32[4] parameter(0)
  ROOT always = pred[] constant(true)
}}

body {{
  p = f32[4] parameter(0)
  ROOT ar = f32[4] all-reduce(p), replica_groups={{}}, to_apply=add, {BODY_META}
}}

ENTRY main {{
  x = f32[4] parameter(0)
  ROOT w = f32[4] while(x), condition=cond, body=body
}}
"""

PSUM_SOURCE = "psum at train.py:42 in step (jit(step)/shard_map/psum)"


def test_the_source_map_reads_stack_frames_and_inline_metadata() -> None:
    module = rp.parse_hlo(SKIPPED)
    sources = SourceMap(module)
    assert str(sources.lookup("psum.7", "on_others")) == PSUM_SOURCE
    assert sources.lookup("psum.7").file == "/home/me/train.py"
    assert sources.lookup("c") is None  # no metadata: nothing to add
    inline = SourceMap(rp.parse_hlo(MISMATCH))
    assert str(inline.lookup("ar_b")) == "psum at model.py:9 (jit(f)/psum)"
    # Metadata is not what an instruction computes: modules that differ only in it are equal.
    assert rp.parse_hlo(SKIPPED.replace("line=42", "line=43")) == module


def test_a_deadlock_names_the_source_and_states_its_finding_once() -> None:
    with pytest.raises(DeadlockError) as info:
        rp.run(SKIPPED, [np.ones(4, np.float32)], backend="threads", timeout=30)
    text = str(info.value)
    head, *rest = text.splitlines()
    assert PSUM_SOURCE in head, text
    assert head.removeprefix("deadlock: ") not in rest  # the first finding is not printed twice
    assert rest[0] == "every unfinished replica is blocked and no message is in flight"
    assert f"blocked in %psum.7 (all-reduce #0) in on_others from {PSUM_SOURCE}" in text
    assert info.value.report.to_dict()["sources"]["psum.7"]["line"] == 42


def test_a_mismatch_names_both_sources_and_prints_values_as_hlo_writes_them() -> None:
    with pytest.raises(CollectiveMismatchError) as info:
        rp.run(MISMATCH, [np.ones(4, np.float32)], backend="threads", timeout=30)
    text = str(info.value)
    assert "psum at model.py:7 (jit(f)/psum)" in text and "psum at model.py:9 (jit(f)/psum)" in text, text
    assert "['" not in text and "[[" not in text, text  # no Python list reprs
    assert ": shapes = [2]" in text and ": shapes = [4]" in text
    assert set(info.value.report.sources) == {"ar_a", "ar_b"}


def test_a_failing_custom_call_names_its_source() -> None:
    def boom(x: np.ndarray) -> np.ndarray:
        raise ValueError("no luck")

    rp.register_custom_call("h31b_boom", boom)
    try:
        with pytest.raises(ReplicaFailure) as info:
            rp.run(RAISES, [np.ones(4, np.float32)], backend="threads", timeout=30)
    finally:
        rp.unregister_custom_call("h31b_boom")
    assert info.value.instruction.startswith("%y (custom-call")
    assert info.value.instruction.endswith("from loss at train.py:40 in step (jit(step)/loss)")
    assert info.value.instruction in str(info.value) and "no luck" in str(info.value)


def test_a_timeout_report_progress_and_trace_name_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from replicas.runtime import batched

    # Each replica on its own, so they wait in the psum for each other (run batched, one thread runs
    # them all and none ever waits in it).
    monkeypatch.setattr(batched, "ENABLED", False)
    trace = tmp_path / "t.json"
    with rp.launch(FOREVER, [np.zeros(4, np.float32)], backend="threads", timeout=60, trace=str(trace)) as job:
        progress = job.progress()
        with pytest.raises(ExecutionTimeout) as info, warnings.catch_warnings():
            # How many events the loop records before the timeout varies: a truncated trace may warn.
            warnings.filterwarnings("ignore", ".*truncated", RuntimeWarning)
            job.result(timeout=0.3)
    assert progress.instruction is None or "psum at train.py:42" in progress.instruction
    text = str(info.value)
    assert "waiting for nothing" not in text, text
    assert "psum at train.py:42 in step (jit(step)/while/body/psum)" in text, text
    report = info.value.report
    # The event tail agrees with the state above it: it ends in the collective the replica waits in.
    for s in report.states:
        if s.status == "blocked" and s.block is not None and s.block.kind == "collective":
            tail = [line for line in text.splitlines() if line.startswith(f"  replica {s.replica}: all-reduce")]
            if tail:
                assert f"#{s.block.seq} " in tail[-1] and tail[-1].endswith("not finished"), text
    slices = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert slices and all(e["args"]["source"] == "psum at train.py:42 in step (jit(step)/while/body/psum)"
                          for e in slices)
    assert slices[0]["name"] == "all-reduce %ar: psum at train.py:42"


def test_progress_names_the_collective_the_slowest_replica_waits_in() -> None:
    from replicas.diagnostics.progress import progress_of
    from replicas.records import BlockInfo, ReplicaState

    block = BlockInfo("collective", "psum.7", "all-reduce", needs="group", computation="on_others", seq=3,
                      group=(0, 1))
    states = [ReplicaState(0, "blocked", block, collectives_started=4), ReplicaState(1, "running", None, "%c (copy)",
                                                                                     collectives_started=5)]
    progress = progress_of(states, 1.0, SourceMap(rp.parse_hlo(SKIPPED)))
    assert progress.collective == 3 and "#3" in progress.instruction  # one number, not #3 and #4
    assert progress.instruction.endswith(PSUM_SOURCE)


def test_the_command_line_names_the_trace_a_failed_job_wrote(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    program = tmp_path / "p.hlo"
    program.write_text(BY_NAME["recv_without_send"].hlo)
    out = tmp_path / "trace.json"
    assert cli_main(["trace", str(program), "--replicas", "2", "--zeros", "--quiet", "--out", str(out)]) == 3
    assert f"wrote {out}: the job up to its error" in capsys.readouterr().err
    run_trace = tmp_path / "run.json"
    assert cli_main(["run", str(program), "--replicas", "2", "--zeros", "--quiet", "--backend", "threads",
                     "--trace", str(run_trace)]) == 3
    assert f"wrote {run_trace}" in capsys.readouterr().err and run_trace.exists()


def test_jax_metadata_names_the_users_line() -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    def step(x):
        return jnp.tanh(x) * 2  # the line the report must name

    line = step.__code__.co_firstlineno + 1
    text = jax.jit(step).lower(np.ones(4, np.float32)).as_text(dialect="hlo", debug_info=True)
    module = rp.parse_hlo(text)
    sources = SourceMap(module)
    found = [sources.lookup(i.name, c.name) for c, i in module.instructions()]
    assert any(s is not None and s.location == f"{Path(__file__).name}:{line}" and s.function.endswith("step")
               for s in found), [str(s) for s in found]
