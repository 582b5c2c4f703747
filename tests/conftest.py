"""Shared test set-up: JAX sees 8 CPU devices (the collective oracle), one Ray session per run."""

import os

# Before anything imports jax: the multi-device CPU backend is the oracle for collectives.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray started once for the whole run and shut down at its end."""
    import ray

    from replicas.runtime.ray_backend import ensure_ray

    ensure_ray()
    yield
    ray.shutdown()
