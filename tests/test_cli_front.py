"""The command line as a user meets it: one clear line for every bad input (never a traceback),
defaults in every help text, arguments filled only with --zeros, a live status on a terminal,
Ctrl-C that cancels, and feeds that say who waits for the host."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import replicas as rp
from replicas.cli import build_parser
from replicas.cli import main as cli_main
from replicas.errors import ExecutionTimeout

PROGRAM = """\
HloModule ar, replica_count=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[3] parameter(0)
  y = f32[] parameter(1)
  ROOT r = f32[3] all-reduce(x), replica_groups={}, to_apply=add
}
"""


def long_loop(trips: int) -> str:
    """An all-reduce per trip of a while loop: long enough to interrupt, and it counts collectives."""
    return f"""\
HloModule loop, replica_count=2

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

cond {{
  c = (s32[], f32[]) parameter(0)
  i = s32[] get-tuple-element(c), index=0
  n = s32[] constant({trips})
  ROOT lt = pred[] compare(i, n), direction=LT
}}

body {{
  b = (s32[], f32[]) parameter(0)
  i = s32[] get-tuple-element(b), index=0
  v = f32[] get-tuple-element(b), index=1
  one = s32[] constant(1)
  next = s32[] add(i, one)
  s = f32[] all-reduce(v), replica_groups={{}}, to_apply=add
  ROOT t = (s32[], f32[]) tuple(next, s)
}}

ENTRY main {{
  zero = s32[] constant(0)
  x = f32[] constant(0)
  init = (s32[], f32[]) tuple(zero, x)
  w = (s32[], f32[]) while(init), condition=cond, body=body
  ROOT out = f32[] get-tuple-element(w), index=1
}}
"""


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "p.hlo"
    path.write_text(PROGRAM)
    return path


def npz(tmp_path: Path, name: str, **arrays: np.ndarray) -> str:
    path = tmp_path / name
    np.savez(path, **arrays)
    return str(path)


def bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    (tmp_path / "text.npz").write_text("not a zip")
    np.save(tmp_path / "one.npy", np.ones(3, np.float32))
    ones = np.ones(3, np.float32)
    return {
        "no args": ([], r"takes 2 argument\(s\) \(%x f32\[3\], %y f32\[\]\) and no --args was given.*--zeros"),
        "missing npz": (["--args", str(tmp_path / "nope.npz")], "nope.npz: no such file"),
        "not a zip": (["--args", str(tmp_path / "text.npz")], r"not an \.npz file \(not a zip archive"),
        "an npy": (["--args", str(tmp_path / "one.npy")], r"a single \.npy array"),
        "object array": (["--args", npz(tmp_path, "obj.npz", arg0=np.array([None], object), arg1=ones)],
                         r"arg0 holds Python objects"),
        "per-replica keys missing": (["--args", npz(tmp_path, "per.npz", r0_arg0=ones, r0_arg1=np.float32(1))],
                                     "missing r1_arg0, r1_arg1, r2_arg0, r2_arg1, r3_arg0, r3_arg1"),
        "shared key missing": (["--args", npz(tmp_path, "shared.npz", arg0=ones)], "missing arg1"),
        "unknown key": (["--args", npz(tmp_path, "extra.npz", arg0=ones, arg1=np.float32(0), x=ones)],
                        "unexpected x"),
        "zero replicas": (["--replicas", "0"], "--replicas/-n: must be a whole number >= 1, got '0'"),
        "negative replicas": (["-n", "-2"], "must be a whole number >= 1, got '-2'"),
        "zero timeout": (["--timeout", "0"], "--timeout: must be a number of seconds > 0, got '0'"),
        "wrong replica count": (["--replicas", "3", "--zeros"], "declares replica_count=4 but num_replicas=3"),
    }


CASES = ["no args", "missing npz", "not a zip", "an npy", "object array", "per-replica keys missing",
         "shared key missing", "unknown key", "zero replicas", "negative replicas", "zero timeout",
         "wrong replica count"]


def exit_code(argv: list[str]) -> int:
    try:
        return cli_main(argv)
    except SystemExit as e:  # argparse's own errors
        return int(e.code or 0)


@pytest.mark.parametrize("command", ["run", "trace"])
@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_exit_2(case: str, command: str, program: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    argv, pattern = bad_inputs(tmp_path)[case]
    assert exit_code([command, str(program), "--backend", "threads", *argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(pattern, lines[0]), lines[0]


def test_zeros_fills_the_arguments(program: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["run", str(program), "--backend", "threads", "--zeros"]) == 0
    assert capsys.readouterr().out.count("float32[3] [0., 0., 0.]") == 4


def test_every_option_shows_its_default_and_the_exit_codes_are_documented() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices  # noqa: SLF001
    for name, sub in subparsers.items():
        text = sub.format_help()
        assert "exit codes:" in text and "130" in text, name
        for action in sub._actions:  # noqa: SLF001
            if action.option_strings and action.dest != "help":
                assert "(default:" in (sub._get_formatter()._expand_help(action)  # noqa: SLF001
                                       if action.help else ""), f"{name} {action.option_strings}"


def test_a_timeout_names_its_title_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "loop.hlo"
    path.write_text(long_loop(10**7))
    assert cli_main(["run", str(path), "--backend", "threads", "--timeout", "0.5", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ExecutionTimeout: still running after 0.5 s")
    assert err.count("still running after") == 1


INFEED = """\
HloModule feed, replica_count=4

ENTRY main {
  tok = token[] after-all()
  in = (f32[2], token[]) infeed(tok)
  v = f32[2] get-tuple-element(in), index=0
  t = token[] get-tuple-element(in), index=1
  ROOT out = token[] outfeed(v, t), outfeed_shape=f32[2]
}
"""


def test_an_outfeed_timeout_names_the_replicas_waiting_for_the_host() -> None:
    with rp.launch(INFEED, backend="threads") as job:
        job.infeed(0, np.ones(2, np.float32))
        np.testing.assert_array_equal(job.outfeed(0, timeout=30), np.ones(2, np.float32))
        with pytest.raises(ExecutionTimeout, match=r"replicas \[1, 2, 3\] wait in %in \(infeed\) for the host"):
            job.outfeed(1, timeout=0.5)
        progress = job.progress()
        assert progress.waiting_for_host == ["replicas [1, 2, 3] wait in %in (infeed) for the host"]
        assert progress.finished == 1 and progress.blocked == 3


def test_progress_is_data() -> None:
    with rp.launch(long_loop(10**7), backend="threads", timeout=None) as job:
        p = job.progress()
        assert p.running + p.blocked + p.finished == 2
        assert p.slowest in (0, 1) and p.elapsed >= 0
        assert set(p.to_dict()) >= {"elapsed", "running", "blocked", "finished", "slowest", "instruction",
                                    "collective", "collectives_per_second"}


def read_terminal(primary: int, until: bytes | None, seen: bytes, deadline: float) -> bytes:
    """What the child writes to its terminal until `until` appears (None: until it closes the
    terminal), failing the test with what it wrote when the deadline passes first."""
    while until is None or until not in seen:
        ready, _, _ = select.select([primary], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no {until!r} within the deadline; the terminal showed: {seen.decode(errors='replace')[-4000:]}"
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the child closed the terminal
            chunk = b""
        if not chunk:
            assert until is None, seen
            break
        seen += chunk
    return seen


def test_live_status_on_a_terminal_and_ctrl_c_cancels(tmp_path: Path) -> None:
    path = tmp_path / "loop.hlo"
    path.write_text(long_loop(10**8))
    primary, secondary = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(Path(rp.__file__).parent.parent), "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "replicas.cli", "run", str(path), "--backend", "threads",
                             "--timeout", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=secondary, env=env)
    os.close(secondary)
    try:
        # the live status is drawn: the job runs
        seen = read_terminal(primary, b"collectives/s", b"", time.monotonic() + 120)
        assert re.search(rb"running 2 .*slowest: replica \d", seen) or b"blocked" in seen, seen
        proc.send_signal(signal.SIGINT)
        seen = read_terminal(primary, None, seen, time.monotonic() + 60)
        assert proc.wait(timeout=60) == 130, seen.decode(errors="replace")[-4000:]  # what it printed instead
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(primary)
    tail = seen.decode(errors="replace")
    assert "interrupted: the job was cancelled" in tail
    assert "Traceback" not in tail and "KeyboardInterrupt" not in tail


def test_quiet_or_a_pipe_shows_no_status(program: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "replicas.cli", "run", str(program), "--backend", "threads",
                          "--zeros"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(rp.__file__).parent.parent)})
    assert out.returncode == 0 and out.stderr == ""


def test_traces_record_every_instruction_and_say_when_truncated(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import json

    path = tmp_path / "loop.hlo"
    path.write_text(long_loop(30))
    full, short, checked = tmp_path / "all.json", tmp_path / "short.json", tmp_path / "check.json"
    assert cli_main(["trace", str(path), "--trace-all", "--out", str(full), "-q"]) == 0
    assert {"op", "collective"} <= {e.get("cat") for e in json.loads(full.read_text())["traceEvents"]}
    assert "warning" not in capsys.readouterr().err
    assert cli_main(["trace", str(path), "--trace-events", "10", "--out", str(short), "-q"]) == 0
    err = capsys.readouterr().err
    assert err.strip() == (f"warning: {short}: truncated: replicas [0, 1] recorded more than 10 events; the trace "
                           "keeps the last 10 of each (raise trace_events= / --trace-events)")
    other = json.loads(short.read_text())["otherData"]
    assert other["truncated"] and other["dropped_events"] == {"0": 20, "1": 20}
    assert cli_main(["check", str(path), "--trace", str(checked), "-q"]) == 0
    assert sum(e.get("cat") == "collective" for e in json.loads(checked.read_text())["traceEvents"]) == 60
