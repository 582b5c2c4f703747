"""Shared test set-up: JAX sees 8 CPU devices (the collective oracle) in 64-bit mode, compiled oracle
programs are cached across runs, and one Ray session serves the whole run."""

import atexit
import contextlib
import getpass
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

# Before anything imports jax: the multi-device CPU backend is the oracle for collectives.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import pytest  # noqa: E402

try:
    import parallel  # noqa: E402 - tests/parallel.py: the suite on two workers (needs pytest-xdist)
except ImportError:
    parallel = None
# Opt-in: pytest's private assertion rewriter, hard links into the venv and hypothesis's constants hook
# (tests/speedups.py).
speedups = __import__("speedups") if os.environ.get("REPLICAS_TEST_BYTECODE") == "1" else None


def configure_jax_and_hypothesis() -> None:
    """In every process that runs tests (not xdist's controller: importing JAX costs it a CPU second)."""
    import jax
    from hypothesis import settings

    # The kernels' tests compare 64-bit types with XLA; test_hlo_text switches it off for its cases.
    jax.config.update("jax_enable_x64", True)

    # A run checks the same examples every time (a failure reproduces; XLA's recorded answers in
    # tests/golden/ match them); REPLICAS_HYPOTHESIS=explore draws new ones.
    settings.register_profile("repeatable", derandomize=True, database=None)
    settings.register_profile("explore", derandomize=False)
    explore = os.environ.get("REPLICAS_HYPOTHESIS") == "explore"
    settings.load_profile("explore" if explore else "repeatable")
    if not explore and speedups is not None:
        speedups.without_local_constants()  # hypothesis's internal hook: opt-in only


def runs_tests(config: pytest.Config) -> bool:
    """False in xdist's controller, whose workers run the tests."""
    if hasattr(config, "workerinput"):
        return True
    return config.getoption("dist", "no") == "no" or not getattr(config.option, "tx", None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The whole suite runs on two pytest-xdist workers by default (tests/parallel.py): before
    xdist's own configure, which starts them."""
    if parallel is not None and config.pluginmanager.hasplugin("xdist"):
        workers = parallel.wants_workers(config)
        if workers:
            config.option.numprocesses, config.option.dist, config.option.tx = workers, "load", ["popen"] * workers
        if config.option.dist != "no" and config.option.tx and not hasattr(config, "workerinput"):
            config.pluginmanager.register(parallel.Controller(config), "replicas-parallel")
    if hasattr(config, "workerinput"):
        atexit.register(exit_without_finalizing)  # now: after the atexit hooks of what the tests import
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # A shell starts a background job (`cmd &`, nohup) with SIGINT ignored, and every process it
        # starts inherits that: the Ctrl-C tests' interrupts would do nothing and their jobs run on.
        signal.signal(signal.SIGINT, signal.default_int_handler)


def exit_without_finalizing() -> None:
    """The run ends when its last xdist worker has, and a worker took 0.4 s (1.8 s when it had run
    Ray's tests: Ray's objects torn down, its session long shut down) after its atexit hooks to end:
    a worker leaves at its last atexit hook instead. Its results went to the controller before (a
    worker's exit status is not read), and Ray's own hook, which shuts a session down, ran already
    (registered later: atexit runs last-in first-out)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def compilation_cache() -> Path:
    """Compiling the XLA oracle's programs is most of the suite's time: they are kept across runs in
    a directory beside pytest's temporary directories (it outlives the last few runs' temp dirs),
    found as pytest finds its own root."""
    try:
        user = getpass.getuser()
    except (ImportError, KeyError, OSError):
        user = "unknown"
    root = Path(os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()) / f"pytest-of-{user}"
    cache = root / "replicas-compilation-cache"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def pytest_sessionstart(session: pytest.Session) -> None:
    cache = compilation_cache()
    prefix_set_up = keep_bytecode(cache / "pyc")
    if runs_tests(session.config):
        # After the bytecode prefix: hypothesis and xdist, imported here, are rewritten by pytest
        # (they are its plugins), and that is cached only once bytecode may be written.
        configure_jax_and_hypothesis()
        import jax

        jax.config.update("jax_compilation_cache_dir", str(cache / "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    (cache / "oracle").mkdir(exist_ok=True)
    os.environ["REPLICAS_XLA_ORACLE_CACHE"] = str(cache / "oracle")
    if prefix_set_up and speedups is not None and not runs_tests(session.config):
        speedups.prebuild_bytecode(session.config)


def keep_bytecode(prefix: Path) -> bool:
    """With PYTHONDONTWRITEBYTECODE set (nothing beside the sources), every Python process of a run
    compiled the package again, and each worker rewrote every test module's asserts again: ~80
    processes (the workers, Ray's workers, the README's commands), 5 of the 8 CPU seconds a worker
    spends collecting. Their bytecode goes to `prefix` instead (PYTHONPYCACHEPREFIX: still nothing
    beside the sources), for this process and every one it starts, before xdist starts its workers.
    A user's own PYTHONPYCACHEPREFIX, or bytecode written beside the sources, is left as it is.
    (Public API only; a fresh prefix fills in the first run, or at once with the opt-in seeding of
    tests/speedups.py.) True when this process set the prefix up."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return False
    prefix.mkdir(exist_ok=True)
    prune_bytecode(prefix)
    if speedups is not None:
        speedups.seed_bytecode(prefix)
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    sys.pycache_prefix = str(prefix)
    sys.dont_write_bytecode = False
    return True


def prune_bytecode(prefix: Path, depth: int = 3) -> None:
    """The prefix mirrors absolute paths, and every fresh clone and venv added its own (~150 MB of
    seeded links each, whose last link is the prefix's once the clone is deleted: 1.9 GB here
    after a day). A directory of the prefix, down to `depth` levels (/tmp/<clone>,
    /work/wt/<tree>), whose source directory no longer exists goes."""
    def prune(folder: Path, level: int) -> None:
        for entry in os.scandir(folder):
            if not entry.is_dir(follow_symlinks=False):
                continue
            source = "/" + os.path.relpath(entry.path, prefix)
            if not os.path.isdir(source):
                shutil.rmtree(entry.path, ignore_errors=True)
            elif level < depth:
                prune(Path(entry.path), level + 1)

    with contextlib.suppress(OSError):
        prune(prefix, 1)


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray started once for the whole run and shut down at its end (on the xdist worker
    that runs the "ray" group, after that group's last test: `pytest_runtest_teardown`)."""
    import ray

    from replicas.runtime.ray.backend import ensure_ray

    with warnings.catch_warnings():
        # Ray starts its daemons by fork and exec (subprocess), which JAX's at-fork hook warns of
        # as if the child went on running this multithreaded process.
        warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
        ensure_ray()
    yield
    ray.shutdown()


CLUSTER_COMMAND = [str(Path(sys.executable).parent / "replicas"), "cluster"]  # the installed command
CLUSTER_PORT_SPAN = 300  # `replicas cluster start --local` uses PORT .. PORT + 299


def free_port_block() -> int:
    """A base port whose whole block is free on 127.0.0.1 now, so two runs on one machine do not collide."""
    for _ in range(50):
        base = random.randrange(20000, 60000 - CLUSTER_PORT_SPAN, 10)
        try:
            for port in range(base, base + CLUSTER_PORT_SPAN):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no free block of {CLUSTER_PORT_SPAN} ports on 127.0.0.1")


@dataclass(frozen=True)
class TwoNodeCluster:
    address: str
    settings: dict[str, str]  # what `replicas cluster start --local` was run with

    def env(self) -> dict[str, str]:
        """This process's environment for a driver that joins the cluster (not this run's own Ray)."""
        env = dict(os.environ, **self.settings)
        env.pop("RAY_ADDRESS", None)
        return env


class ClusterRun:
    """The README's `replicas cluster start --local`, run once for every test that needs two
    nodes, and its `stop`. Both mostly wait for Ray's processes to come up or go (~15 s and ~8 s
    of wall time, under 2 s of CPU). `start` runs when the first test that needs the cluster sets
    up, after the README's tests (one local Ray starting at a time in their group: five at once on
    2 cores overran Ray's fixed 30 s for a node to register), and `stop` in the background after the
    last test that uses the cluster; the run's end waits for it."""

    def __init__(self) -> None:
        self.needed = False  # some test of this run uses the cluster
        self.settings: dict[str, str] = {}
        self.starting: subprocess.Popen[str] | None = None
        self.cluster: TwoNodeCluster | None = None
        self.stopping: list[tuple[subprocess.Popen[bytes], str]] = []
        self.driver: ClusterDriver | None = None  # `cluster_driver`

    def start(self) -> None:
        if self.starting is not None:
            return
        # Ray's unix socket paths must stay under 108 bytes: a short directory, not pytest's tmp_path.
        base = tempfile.mkdtemp(prefix="rpc-", dir="/tmp")
        self.settings = {"REPLICAS_CLUSTER_DIR": base, "REPLICAS_CLUSTER_PORT": str(free_port_block())}
        self.starting = subprocess.Popen([*CLUSTER_COMMAND, "start", "--local"], env=self._env(),
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def get(self) -> TwoNodeCluster:
        """The running cluster, once its start has finished (started now if it was not)."""
        if self.cluster is None:
            self.start()
            assert self.starting is not None
            out, err = self.starting.communicate(timeout=180)
            assert self.starting.returncode == 0, out + err
            self.cluster = TwoNodeCluster(out.strip().splitlines()[-1], self.settings)
        return self.cluster

    def stop(self) -> None:
        """Start the cluster's `stop` (after its `start` has finished: stopping a half-started
        cluster could miss the processes still coming up)."""
        if self.starting is None:
            return
        self.close_driver()
        self.starting.communicate(timeout=180)
        stopping = subprocess.Popen([*CLUSTER_COMMAND, "stop", "--local"], env=self._env(),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.stopping.append((stopping, self.settings["REPLICAS_CLUSTER_DIR"]))
        self.starting = self.cluster = None

    def close_driver(self) -> None:
        if self.driver is not None:
            self.driver.close()
            self.driver = None

    def close(self) -> None:
        """Stop the cluster if it runs, and wait for every `stop` to finish."""
        self.stop()
        for stopping, base in self.stopping:
            stopping.wait(timeout=120)
            shutil.rmtree(base, ignore_errors=True)
        self.stopping.clear()

    def _env(self) -> dict[str, str]:
        return TwoNodeCluster("", self.settings).env()


# The cluster driver's loop: each request (a line of JSON: a script and its argv) runs in a fresh
# namespace of this one process, its stdout captured; the answer is a line of JSON.
DRIVER_LOOP = """
import contextlib, io, json, sys, traceback
answers = sys.stdout
for line in sys.stdin:
    request, out, code = json.loads(line), io.StringIO(), 0
    sys.argv = request["argv"]
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(request["script"], request["argv"][0], "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        code = 1
        out.write(traceback.format_exc())
    answers.write(json.dumps({"code": code, "stdout": out.getvalue()}) + "\\n")
    answers.flush()
"""


class ClusterDriver:
    """One driver process joined to the run's two-node cluster, for the tests that run healthy jobs
    on it (`cluster_driver`). A driver's Ray workers serve it alone, so every driver process started
    its own actors (one per replica placed by resources: ~1.2 CPU s and a second or two each) and
    joined the cluster again; in one process the second test's jobs take the first's pooled actors.
    Each script still runs as a driver's `__main__`, in a subprocess: this run's own process is
    attached to the shared local Ray session."""

    def __init__(self, cluster: TwoNodeCluster) -> None:
        self.stderr = tempfile.NamedTemporaryFile("w+", prefix="cluster-driver-", suffix=".log")
        self.proc = subprocess.Popen([sys.executable, "-u", "-c", DRIVER_LOOP], env=cluster.env(), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)

    def run(self, script: str, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`script` run with `argv` (argv[0]: its name) as `python script args...` would, in this driver."""
        import json
        import threading

        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"script": script, "argv": argv}) + "\n")
        self.proc.stdin.flush()
        answer: list[str] = []
        reader = threading.Thread(target=lambda: answer.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        self.stderr.seek(0)
        err = self.stderr.read()
        if not answer or not answer[0]:
            self.close()
            return subprocess.CompletedProcess(argv, -1, "", err + f"\n(no answer within {timeout} s)")
        done = json.loads(answer[0])
        return subprocess.CompletedProcess(argv, done["code"], done["stdout"], err)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the loop ends, and Ray's exit hook disconnects the driver
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


CLUSTER = ClusterRun()


@pytest.fixture
def two_node_cluster() -> TwoNodeCluster:
    """The run's two-node cluster (`ClusterRun`): its tests run last in their group, together."""
    return CLUSTER.get()


@pytest.fixture
def cluster_driver(two_node_cluster: TwoNodeCluster) -> ClusterDriver:
    """The run's driver process on the two-node cluster (`ClusterDriver`), started by the first
    test that needs it and ended with the cluster, or before a test breaks the cluster."""
    if CLUSTER.driver is None or CLUSTER.driver.proc.poll() is not None:
        CLUSTER.driver = ClusterDriver(two_node_cluster)
    return CLUSTER.driver


@pytest.fixture
def two_node_cluster_to_break(two_node_cluster: TwoNodeCluster) -> TwoNodeCluster:
    """The run's cluster for a test that ends one of its nodes: such tests run after every other
    test on the cluster (the shared driver is ended first: its actors would die with the node)."""
    CLUSTER.close_driver()
    return two_node_cluster


def _uses_cluster(item: pytest.Item | None) -> bool:
    return item is not None and "two_node_cluster" in getattr(item, "fixturenames", ())


def group_of(item: pytest.Item) -> str:
    """Tests that must run in one process, in order: "ray" (this run's Ray session: one per run),
    "subprocess" (the README's demo, blocks and commands, whose `workdir` the cluster test uses
    too, then the tests on the two-node cluster); "" for the rest."""
    fixtures = getattr(item, "fixturenames", ())
    if "readme_run" in fixtures or "two_node_cluster" in fixtures:
        return "subprocess"
    if item.get_closest_marker("hosts"):
        return "hosts"  # one set of simulated hosts per module: its tests on one worker
    return "ray" if item.get_closest_marker("ray") else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that starts Ray (through the `ray_session` fixture) carries the `ray` marker, so
    `-m "not ray"` runs the rest without starting Ray; the README's blocks and then the tests on the
    two-node cluster run last, so the cluster lives only while they run, and those that break it
    after the others."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)

    def place(item: pytest.Item) -> int:
        fixtures = getattr(item, "fixturenames", ())
        if "two_node_cluster_to_break" in fixtures:
            return 3
        return 2 if "two_node_cluster" in fixtures else int(group_of(item) == "subprocess")

    items.sort(key=place)
    if parallel is not None:
        parallel.write_groups(config, {item.nodeid: group for item in items if (group := group_of(item))},
                              [item.nodeid for item in items if item.get_closest_marker("slow")])


def pytest_collection_finish(session: pytest.Session) -> None:
    CLUSTER.needed = any(_uses_cluster(item) for item in session.items)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if CLUSTER.needed and _uses_cluster(item):
        CLUSTER.start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    yield
    if _uses_cluster(item) and not _uses_cluster(nextitem):
        CLUSTER.stop()
    if nextitem is not None and _ray_group_ended(item, nextitem):
        # The session's Ray is idle from here to the worker's end (a third of the run): its daemons
        # and ~20 pooled actors took ~0.2 CPU s per second of it.
        import ray

        ray.shutdown()


def _ray_group_ended(item: pytest.Item, nextitem: pytest.Item) -> bool:
    """`item` was the last test of the "ray" group on an xdist worker of tests/parallel.py, where
    the group's tests run one after another, and no test after it uses this run's Ray."""
    grouped = parallel is not None and parallel.GROUPS_KEY in getattr(item.config, "workerinput", {})
    return grouped and group_of(item) == "ray" != group_of(nextitem) and _ray_running()


def pytest_sessionfinish(session: pytest.Session) -> None:
    CLUSTER.close()
    oracle = sys.modules.get("xla_oracle")
    if oracle is not None:
        oracle.GOLDEN.write()  # REPLICAS_GOLDEN=record
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller sums them
        session.config.workeroutput["oracle_computed"] = oracle_computed()


def oracle_computed() -> int:
    """How many XLA oracle answers this process computed that tests/golden/xla_oracle.zip lacked."""
    oracle = sys.modules.get("xla_oracle")
    return oracle.GOLDEN.computed if oracle is not None else 0


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    computed = oracle_computed() + getattr(config, "oracle_computed_by_workers", 0)
    if computed and os.environ.get("REPLICAS_GOLDEN") not in ("record", "verify"):
        terminalreporter.write_line(f"XLA oracle: {computed} answers were not recorded in tests/golden/xla_oracle.zip "
                                    "and were computed (REPLICAS_GOLDEN=record adds them)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A test without the `ray` marker must not start Ray (`-m "not ray"` would start it anyway)."""
    ray_before = _ray_running()
    yield
    if not ray_before and _ray_running() and not item.get_closest_marker("ray"):
        pytest.fail(f"{item.nodeid} started Ray without the ray_session fixture or the ray marker")


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()
