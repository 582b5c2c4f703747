"""`replicas check program.hlo --replicas N [--args ...]` over the catalog of buggy programs, in process."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from buggy_programs import BY_NAME, CASES, CHECK_ONLY, CORRECT, LENIENT_OK, Case

import replicas as rp
from replicas.checker import find_problem
from replicas.cli import main as cli_main
from replicas.errors import CollectiveMismatchError, DeadlockError, ProgramError

# Host feeds have no command-line form: the cases that preload an infeed stay with rp.run.
CLI_CASES = [c for c in CASES if c.infeed is None]


def run_check(case: Case, tmp_path: Path, *extra: str) -> list[str]:
    program = tmp_path / f"{case.name}.hlo"
    program.write_text(case.hlo)
    argv = ["check", str(program), "--replicas", str(case.num_replicas), "--timeout", "30", *extra]
    args = case.args()
    if any(args):
        npz = tmp_path / "args.npz"
        np.savez(npz, **{f"r{r}_arg{i}": v for r, a in enumerate(args) for i, v in enumerate(a)})
        argv += ["--args", str(npz)]
    return argv


def blocked_replicas(out: str) -> set[int]:
    """The replicas of the report's `replica 3: blocked in ...` / `replicas [0, 1] ...` / `replicas 0-9` lines."""
    found: set[int] = set()
    for ids in re.findall(r"^  replicas? ([^:]+): blocked in", out, re.M):
        for part in ids.strip("[]").split(", "):
            low, _, high = part.partition("-")
            found.update(range(int(low), int(high or low) + 1))
    return found


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.name for c in CLI_CASES])
def test_check_reports_the_bug(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(run_check(case, tmp_path))
    out = capsys.readouterr().out
    expected_code = 3 if case.error in (DeadlockError, CollectiveMismatchError) else 2
    assert code == expected_code, out
    assert out.startswith(f"{case.error.__name__}: ")
    assert "ExecutionTimeout" not in out
    for name in case.instructions:
        assert f"%{name}" in out
    for phrase in case.phrases:
        assert phrase in out
    if case.cycle is not None:
        assert "cycle: " + " -> ".join(map(str, case.cycle + case.cycle[:1])) in out
    if case.error is DeadlockError:
        assert "wait-for graph" in out
        assert set(case.replicas) <= blocked_replicas(out)
    if case.mismatch_field is not None:
        assert "expected (replica" in out and "vs found (replica" in out
        assert f": {case.mismatch_field} = " in out
        assert sum(line.startswith(("- ", "+ ")) for line in out.splitlines()) >= 2


@pytest.mark.parametrize("case", CORRECT, ids=[c.name for c in CORRECT])
def test_check_passes_correct_programs(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(run_check(case, tmp_path)) == 0
    assert capsys.readouterr().out.startswith("ok: ")


def test_check_lenient_accepts_same_form_collectives(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(run_check(LENIENT_OK, tmp_path)) == 3
    capsys.readouterr()
    assert cli_main(run_check(LENIENT_OK, tmp_path, "--lenient")) == 0
    assert "ok: " in capsys.readouterr().out


def test_check_mismatch_diff_reads_expected_vs_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(run_check(BY_NAME["mismatched_shapes"], tmp_path)) == 3
    lines = capsys.readouterr().out.splitlines()
    minus = [line for line in lines if line.startswith("- ")]
    plus = [line for line in lines if line.startswith("+ ")]
    assert any(": shapes = [4]" in line for line in minus + plus)  # as HLO writes it, not a Python list
    assert any(": shapes = [2]" in line for line in minus + plus)
    assert {line.split(":")[0][2:] for line in minus + plus if "shapes" in line} == {
        "replica 0 %ar_a", "replica 1 %ar_b"}


def test_check_a_missing_file_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["check", str(tmp_path / "nope.hlo"), "--replicas", "2"])
    assert code == 2
    captured = capsys.readouterr()
    assert "nope.hlo" in captured.out + captured.err
    assert "Traceback" not in captured.out + captured.err


@pytest.mark.parametrize("case", CHECK_ONLY, ids=[c.name for c in CHECK_ONLY])
def test_check_reports_messages_nobody_received(case: Case, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    module = rp.parse_hlo(case.hlo)
    assert len(rp.run(module, case.args(), num_replicas=2, backend="threads", timeout=30)) == 2  # silent in run
    problem = find_problem(module, case.args(), 2)
    assert isinstance(problem, ProgramError)
    code, out = code_and_output(case, tmp_path, capsys)
    assert code == 2
    assert out.startswith("ProgramError: messages nobody received")
    for phrase in case.phrases:
        assert phrase in str(problem) and phrase in out


def code_and_output(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli_main(run_check(case, tmp_path))
    return code, capsys.readouterr().out
