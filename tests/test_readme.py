"""The README works as written: its code blocks and commands run in order in one empty directory,
as a new user would run them (a doc test: the README itself is read, nothing is copied)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w+)\n(.*?)```", README, re.S)]
PYTHON_BLOCKS = [code for lang, code in BLOCKS if lang == "python"]
SHELL_BLOCKS = [code for lang, code in BLOCKS if lang == "bash"]
DEMO, TESTS = SHELL_BLOCKS[0].strip(), SHELL_BLOCKS[1].strip()
COMMANDS = [block for block in SHELL_BLOCKS[2:] if "cluster start --local" not in block]
CLUSTER = [block for block in SHELL_BLOCKS[2:] if "cluster start --local" in block]
BIN = Path(sys.executable).parent


def user_env(**extra: str) -> dict[str, str]:
    """A user's shell: the package importable and its commands on PATH, no test-run settings
    (no XLA_FLAGS: the README sets it; no RAY_ADDRESS: this run's own Ray is not the user's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "RAY_ADDRESS", "PYTEST_CURRENT_TEST")}
    env.update(PYTHONPATH=str(ROOT), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", COLUMNS="100", **extra)
    return env


def run_lines(block: str, cwd: Path, env: dict[str, str]) -> str:
    out = []
    for line in block.strip().splitlines():
        done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        out.append(done.stdout)
    return "".join(out)


def test_the_readme_opens_with_the_demo_and_the_ci_test_command() -> None:
    assert README.index(DEMO) < README.index(TESTS) < README.index("## ")
    ci = (ROOT / ".ci" / "run").read_text().replace(" -q ", " ")  # CI installs quietly
    venv, install, pytest_cmd = (part.strip() for part in TESTS.split("&&"))
    assert venv == "python3 -m venv .venv" and venv in ci
    assert install in ci and pytest_cmd in ci


MARK = "--- the README's Python blocks ---"


@dataclass(frozen=True)
class ReadmeRun:
    path: Path  # the directory the demo and the blocks ran in (the commands run there too)
    demo_out: str
    demo_err: str
    blocks_out: str


@pytest.fixture(scope="session")  # the cluster test, which runs last, uses it too
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> ReadmeRun:
    """The README's demo command, then its Python blocks in order, in one interpreter, in an empty
    directory. One interpreter for both: each started its own local Ray (`ensure_ray` always starts
    a private one), ~8 CPU s and ~12 s of a loaded 2-core machine each. The demo runs first, as the
    README's first line, in the fresh interpreter (its Ray start is the one checked for quiet): the
    `replicas` script the install put on PATH, run as `__main__` (what the shell would run); the
    blocks follow in the same interpreter, Ray already up."""
    path = tmp_path_factory.mktemp("readme")
    *install, command = (part.strip() for part in DEMO.split("&&"))
    assert install == ["python3 -m venv .venv", ".venv/bin/pip install -e ."]
    argv = shlex.split(command.replace(".venv/bin/", ""))  # the venv is this test run's
    env = user_env()
    script = shutil.which(argv[0], path=env["PATH"])
    assert script is not None, f"{argv[0]} is not on PATH: is the package installed?"
    code = "\n".join([
        "import runpy, sys",
        f"sys.argv = {[script, *argv[1:]]!r}",
        "try:",
        f"    runpy.run_path({script!r}, run_name='__main__')",
        "except SystemExit as e:",
        "    if e.code not in (0, None):",
        "        raise",
        f"print({MARK!r}, flush=True)",
        f"print({MARK!r}, file=sys.stderr, flush=True)",
        *PYTHON_BLOCKS,
        "import ray",
        "ray.shutdown()",
    ])
    out = subprocess.run([sys.executable, "-c", code], cwd=path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    demo_out, _, blocks_out = out.stdout.partition(MARK + "\n")
    demo_err, _, _ = out.stderr.partition(MARK + "\n")
    return ReadmeRun(path, demo_out, demo_err, blocks_out)


@pytest.fixture(scope="session")
def workdir(readme_run: ReadmeRun) -> Path:
    """The directory the README's Python blocks ran in."""
    return readme_run.path


def test_the_demo_runs(readme_run: ReadmeRun) -> None:
    """The README's demo command, its first line."""
    assert "replica 3: all-reduce = [6.0, 10.0," in readme_run.demo_out
    assert readme_run.demo_err == "", readme_run.demo_err  # a quiet local Ray: no raylet or log-level lines


def test_the_python_blocks_run(readme_run: ReadmeRun, workdir: Path) -> None:
    assert "[0. 0. 1. 1. 2. 2. 3. 3.]" in readme_run.blocks_out
    assert (workdir / "program.hlo").is_file() and (workdir / "args.npz").is_file()


def test_the_commands_run(workdir: Path) -> None:
    out = "".join(run_lines(block, workdir, user_env()) for block in COMMANDS)
    assert out.startswith("note: no --args given")
    assert (workdir / "results.npz").is_file() and (workdir / "trace.json").is_file()
    assert "exit codes:" in out


@pytest.mark.cluster
@pytest.mark.ray
def test_the_cluster_commands_run(workdir: Path, two_node_cluster) -> None:
    """The session's two-node cluster is the README's `start` line, run with these settings; its
    `stop` line ends it after the last test that uses it."""
    start, *commands, stop = (line.strip() for line in CLUSTER[0].strip().splitlines())
    assert (start, stop) == ("replicas cluster start --local", "replicas cluster stop --local")
    out = run_lines("\n".join(commands), workdir, user_env(**two_node_cluster.settings))
    assert "replica 3: float32[8]" in out
