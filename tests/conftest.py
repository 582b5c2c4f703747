"""Shared test set-up: JAX sees 8 CPU devices (the collective oracle) in 64-bit mode, compiled oracle
programs are cached across runs, and one Ray session serves the whole run."""

import os

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that starts Ray (through the `ray_session` fixture) carries the `ray` marker, so
    `-m "not ray"` runs the rest without starting Ray."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
