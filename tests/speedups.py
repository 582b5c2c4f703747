"""Opt-in speed-ups (`REPLICAS_TEST_BYTECODE=1`), on top of the pycache prefix
`conftest.keep_bytecode` sets up: the prefix seeded with hard links to the libraries' own bytecode
(else the first run compiles the standard library, JAX and Ray into it), the test modules' asserts
rewritten once by the controller through pytest's private rewriter (else each xdist worker
rewrites them as it collects), and hypothesis's examples kept independent of the constants in
`replicas/` (`without_local_constants`: the examples, and so the XLA answers tests/golden/ holds
for them, stay the same whatever constant a branch edits; else answers the store lacks are
computed with XLA in the run).

Not the default: it relies on pytest and hypothesis internals (`_pytest.assertion.rewrite`,
`hypothesis.internal.conjecture.providers`) and on the file system (hard links into the venv),
which a version bump or another machine may change; without it the suite runs the same tests on
public API only, and a warm prefix (a second run) is as quick.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest


def seed_bytecode(prefix: Path) -> None:
    """A pycache prefix hides the bytecode beside the sources: with an empty one (a fresh clone, a
    fresh venv: every CI run) each process of a run compiled the standard library, JAX, Ray and
    the rest of the venv again, several at once (both workers' start-up, the first Ray's daemons
    and workers, the README's commands): ~5 CPU s per process, 18 s of a fresh clone's start-up.
    The compiled modules of the interpreter's and the venv's libraries are linked into `prefix`
    where Python looks for them (a stale one is recompiled and replaced, as beside its source:
    the link, not the file beside the source), once per library directory (a marker file)."""
    import sysconfig

    tag = sys.implementation.cache_tag
    if tag is None:
        return
    suffix = f".{tag}.pyc" if not sys.flags.optimize else f".{tag}.opt-{min(sys.flags.optimize, 2)}.pyc"
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[name]) for name in ("stdlib", "purelib", "platlib")}
    for root in sorted(roots):
        marker = Path(str(prefix) + root) / f".seeded{suffix}"
        if marker.exists() or not os.path.isdir(root):
            continue
        for folder, dirs, _files in os.walk(root):
            # The interpreter's own site-packages is not the venv's (a venv's library is a root).
            dirs[:] = [d for d in dirs if d != "site-packages" or os.path.join(folder, d) in roots]
            if "__pycache__" not in dirs:
                continue
            dirs.remove("__pycache__")
            names = [name for name in os.listdir(os.path.join(folder, "__pycache__")) if name.endswith(suffix)]
            if not names:
                continue
            target = str(prefix) + folder
            os.makedirs(target, exist_ok=True)
            for name in names:
                source, link = os.path.join(folder, "__pycache__", name), os.path.join(target, name)
                try:
                    os.link(source, link)  # a hard link: a twentieth of a symlink's cost here
                except FileExistsError:
                    pass  # compiled into the prefix already (or seeded by a concurrent run)
                except OSError:  # another file system, or no hard links allowed
                    with contextlib.suppress(FileExistsError):
                        os.symlink(source, link)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


def prebuild_bytecode(config: pytest.Config) -> None:
    """What the seeded prefix lacks in a fresh clone: the bytecode of the project's own modules
    and the test modules and plugins (hypothesis, xdist) with pytest's asserts rewritten. Both
    xdist workers compiled and rewrote all of it at once as they collected (~3.5 CPU s each, the
    same work twice: 13 s of a cold start against 6.6 s warm); the controller builds what is
    missing once, before the workers start, in two processes. Rewriting as pytest's import hook
    would (its private helpers: without them, or on any error, the workers do it as before)."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return
    helpers = ("assertstate_key", "_rewrite_test", "_write_pyc", "get_cache_dir", "PYC_TAIL")
    if not all(hasattr(rewrite, name) for name in helpers):
        return
    state = config.stash.get(rewrite.assertstate_key, None)
    hook = getattr(state, "hook", None)
    if hook is None:
        return
    import fnmatch
    import importlib.util
    import py_compile

    tests = Path(__file__).parent
    patterns = list(config.getini("python_files")) + ["conftest.py"]
    jobs: list[tuple[Path, bool]] = [(path, any(fnmatch.fnmatch(path.name, p) for p in patterns))
                                     for path in tests.glob("*.py")]
    jobs += [(path, False) for path in (tests.parent / "replicas").rglob("*.py")]
    for name in sorted(n for n in getattr(hook, "_must_rewrite", ()) if "." not in n):  # the plugins' packages
        spec = importlib.util.find_spec(name)  # a top-level name: found, not imported
        if spec is not None and spec.submodule_search_locations:
            jobs += [(path, True) for where in spec.submodule_search_locations for path in Path(where).rglob("*.py")]
        elif spec is not None and spec.origin and spec.origin.endswith(".py"):
            jobs.append((Path(spec.origin), True))

    def target(path: Path, rewritten: bool) -> Path:
        if rewritten:
            return rewrite.get_cache_dir(path) / (path.name[:-3] + rewrite.PYC_TAIL)
        return Path(importlib.util.cache_from_source(str(path)))

    todo = sorted(((p, r) for p, r in jobs if not target(p, r).exists()), key=lambda job: -job[0].stat().st_size)
    if not todo:
        return
    child = os.fork()  # half each (largest first, alternately): the workers have not started yet
    try:
        for path, rewritten in todo[child == 0::2]:
            try:
                if rewritten:
                    os.makedirs(rewrite.get_cache_dir(path), exist_ok=True)
                    source_hash, code = rewrite._rewrite_test(path, config)
                    rewrite._write_pyc(state, code, source_hash, target(path, rewritten))
                else:
                    py_compile.compile(str(path), cfile=str(target(path, rewritten)), doraise=True)
            except Exception:  # noqa: BLE001 - a module that does not build is the workers' to report
                continue
    finally:
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)


def without_local_constants() -> None:
    """Hypothesis (6.x) draws some choices from the constants of the project's modules imported so
    far (`replicas/`, not the tests): an edit of any constant there changes the suite's examples,
    and with them the XLA answers tests/golden/ must hold. Without them the examples depend on the
    tests alone (hypothesis's own constants stay). No setting turns them off: its internal hook,
    where it exists."""
    from hypothesis.internal.conjecture import providers

    if hasattr(providers, "_get_local_constants") and hasattr(providers, "Constants"):
        providers._get_local_constants = providers.Constants  # an empty set of each kind
