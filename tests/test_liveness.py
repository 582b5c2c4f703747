"""The replicas' own liveness across hosts (replicas/cluster/liveness.py), with real Ray actors: an
actor of another node that does not answer is named after LIVENESS_SECONDS, unless the actors that
did answer read bytes from its host meanwhile (busy, not gone); then it gets more time, as long as
its bytes keep coming. The node labels are given, so one machine's actors play both hosts."""

from __future__ import annotations

import threading

import pytest

from replicas.cluster import liveness

pytestmark = pytest.mark.ray

WAIT = 30  # seconds: a bound on a held call, released by each test


@pytest.fixture
def actors(ray_session, monkeypatch):
    import ray

    @ray.remote(max_concurrency=2, num_cpus=0)
    class Holder:
        def __init__(self) -> None:
            self.released = threading.Event()

        def answer(self) -> bool:
            return True

        def hold(self) -> bool:
            return self.released.wait(WAIT)

        def release(self) -> None:
            self.released.set()

    monkeypatch.setattr(liveness, "LIVENESS_SECONDS", 0.3)
    pair = [Holder.remote(), Holder.remote()]
    ray.get([a.answer.remote() for a in pair])
    yield ray, pair
    for a in pair:
        ray.get(a.release.remote())
        ray.kill(a)


def test_a_quiet_host_is_named_once_its_bytes_stop_coming(actors):
    ray, (quick, slow) = actors
    asked = []

    def heard(quiet, answered):
        asked.append((quiet, answered))
        return set(quiet) if len(asked) < 3 else set()  # bytes came for two windows, then none

    refs = [quick.answer.remote(), slow.hold.remote()]
    assert liveness.silent(ray, refs, ["here", "there"], "here", heard=heard) == [1]
    assert asked == [([1], [0])] * 3


def test_a_busy_host_that_answers_within_its_extra_time_is_not_named(actors):
    ray, (quick, slow) = actors

    def heard(quiet, answered):
        ray.get(slow.release.remote())  # busy, then answers
        return set(quiet)

    refs = [quick.answer.remote(), slow.hold.remote()]
    assert liveness.silent(ray, refs, ["here", "there"], "here", heard=heard) == []
    assert ray.get(refs[1]) is True


def test_without_word_of_its_bytes_a_quiet_host_is_named_after_one_window(actors):
    ray, (quick, slow) = actors
    refs = [quick.answer.remote(), slow.hold.remote()]
    assert liveness.silent(ray, refs, ["here", "there"], "here") == [1]
    assert liveness.silent(ray, refs, ["here", "there"], "here", heard=lambda quiet, answered: set()) == [1]


def test_an_actor_of_the_drivers_node_or_a_poll_nobody_answered_is_never_judged(actors):
    ray, (quick, slow) = actors
    assert liveness.silent(ray, [quick.answer.remote(), slow.hold.remote()], ["here", "here"], "here") == []
    assert liveness.silent(ray, [quick.hold.remote(), slow.hold.remote()], ["there", "there"], "here") == []
