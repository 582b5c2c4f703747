"""The examples are user stories: each runs and gives the answer it promises."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import replicas as rp

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("n", [1, 2, 4])
def test_dp_sgd_matches_single_replica_training(n):
    dp_sgd = load_example("dp_sgd")
    parallel, single, true_w = dp_sgd.train(n, steps=30, backend="threads")
    for w in parallel[1:]:
        assert w.tobytes() == parallel[0].tobytes()  # bitwise equal across replicas
    np.testing.assert_allclose(parallel[0], single, rtol=1e-4, atol=1e-5)
    assert np.abs(parallel[0] - true_w).max() < np.abs(true_w).max()  # it learned something


def test_dp_sgd_on_ray_actors(ray_session):
    dp_sgd = load_example("dp_sgd")
    parallel, single, _ = dp_sgd.train(4, steps=20, backend="ray")
    assert all(w.tobytes() == parallel[0].tobytes() for w in parallel)
    np.testing.assert_allclose(parallel[0], single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["threads", pytest.param("ray", marks=pytest.mark.ray)])
def test_pipeline_stage_output_matches_single_replica(backend, request):
    if backend == "ray":
        request.getfixturevalue("ray_session")
    pipeline = load_example("pipeline")
    got, want = pipeline.run_pipeline(micro_batches=6, backend=backend)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_infeed_training_reads_one_loss_per_step_and_learns():
    infeed_training = load_example("infeed_training")
    losses, weights = infeed_training.train(num_replicas=2, steps=15, backend="threads")
    assert len(losses) == 15
    assert losses[-1] < 0.1 * losses[0]
    assert weights[0].tobytes() == weights[1].tobytes()


def test_the_document_deadlock_example_is_reported_with_its_cycle():
    deadlock = load_example("deadlock")
    with pytest.raises(rp.DeadlockError) as info:
        rp.run(deadlock.program(), [np.zeros(4, np.float32)], num_replicas=2, backend="threads", timeout=30)
    assert info.value.report.cycles == [[0, 1]]
    assert "send-done" in str(info.value)
