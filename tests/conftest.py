"""Shared test set-up: JAX sees 8 CPU devices (the collective oracle) in 64-bit mode, compiled oracle
programs are cached across runs, and one Ray session serves the whole run."""

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Before anything imports jax: the multi-device CPU backend is the oracle for collectives.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# The kernels' tests compare 64-bit types with XLA; test_hlo_text switches it off for its cases.
jax.config.update("jax_enable_x64", True)

# A run checks the same examples every time (a failure reproduces; XLA's recorded answers in
# tests/golden/ match them); REPLICAS_HYPOTHESIS=explore draws new ones.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile("explore" if os.environ.get("REPLICAS_HYPOTHESIS") == "explore" else "repeatable")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compiling the XLA oracle's programs is most of the suite's time: keep them across runs in a
    directory beside pytest's temporary directories (it outlives the last few runs' temp dirs)."""
    cache = session.config._tmp_path_factory.getbasetemp().parent / "replicas-compilation-cache"
    cache.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(cache / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    (cache / "oracle").mkdir(exist_ok=True)
    os.environ["REPLICAS_XLA_ORACLE_CACHE"] = str(cache / "oracle")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray started once for the whole run and shut down at its end."""
    import ray

    from replicas.runtime.ray_backend import ensure_ray

    ensure_ray()
    yield
    ray.shutdown()


CLUSTER_SCRIPT = Path(__file__).resolve().parent.parent / "cluster" / "local_cluster.sh"
CLUSTER_PORT_SPAN = 300  # local_cluster.sh uses PORT .. PORT + 299


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
    settings: dict[str, str]  # what `cluster/local_cluster.sh start` was run with

    def env(self) -> dict[str, str]:
        """This process's environment for a driver that joins the cluster (not this run's own Ray)."""
        env = dict(os.environ, **self.settings)
        env.pop("RAY_ADDRESS", None)
        return env


@pytest.fixture(scope="session")
def two_node_cluster():
    """The README's `bash cluster/local_cluster.sh start`, run once for every test that needs two
    nodes (they run last, together), and its `stop` at the end."""
    # Ray's unix socket paths must stay under 108 bytes: a short directory, not pytest's tmp_path.
    base = tempfile.mkdtemp(prefix="rpc-", dir="/tmp")
    settings = {"REPLICAS_CLUSTER_DIR": base, "REPLICAS_CLUSTER_PORT": str(free_port_block()),
                "PYTHON": sys.executable, "RAY_AUTH_MODE": "disabled"}
    cluster = TwoNodeCluster("", settings)
    try:
        started = subprocess.run(["bash", str(CLUSTER_SCRIPT), "start"], env=cluster.env(), capture_output=True,
                                 text=True, timeout=180)
        assert started.returncode == 0, started.stdout + started.stderr
        yield TwoNodeCluster(started.stdout.strip().splitlines()[-1], settings)
    finally:
        subprocess.run(["bash", str(CLUSTER_SCRIPT), "stop"], env=cluster.env(), capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def two_node_cluster_to_break(two_node_cluster: TwoNodeCluster) -> TwoNodeCluster:
    """The session's cluster for a test that ends one of its nodes: such tests run after every
    other test on the cluster."""
    return two_node_cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that starts Ray (through the `ray_session` fixture) carries the `ray` marker, so
    `-m "not ray"` runs the rest without starting Ray; the tests on the two-node cluster run last,
    so it lives only while they run, and those that break it after the others."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)

    def place(item: pytest.Item) -> int:
        fixtures = getattr(item, "fixturenames", ())
        return 2 if "two_node_cluster_to_break" in fixtures else int("two_node_cluster" in fixtures)

    items.sort(key=place)


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
