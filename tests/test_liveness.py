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
    trio = [Holder.remote(), Holder.remote(), Holder.remote()]
    ray.get([a.answer.remote() for a in trio])
    yield ray, trio
    for a in trio:
        ray.get(a.release.remote())
        ray.kill(a)


def test_a_quiet_host_is_named_once_its_bytes_stop_coming(actors):
    ray, (quick, slow, _) = actors
    asked = []

    def heard(quiet, answered):
        asked.append((quiet, answered))
        return set(quiet) if len(asked) < 3 else set()  # bytes came for two windows, then none

    refs = [quick.answer.remote(), slow.hold.remote()]
    assert liveness.silent(ray, refs, ["here", "there"], "here", heard=heard) == [1]
    assert asked == [([1], [0])] * 3


def test_a_busy_host_that_answers_within_its_extra_time_is_not_named(actors):
    ray, (quick, slow, _) = actors

    def heard(quiet, answered):
        ray.get(slow.release.remote())  # busy, then answers
        return set(quiet)

    refs = [quick.answer.remote(), slow.hold.remote()]
    assert liveness.silent(ray, refs, ["here", "there"], "here", heard=heard) == []
    assert ray.get(refs[1]) is True


def test_without_word_of_its_bytes_a_quiet_host_is_named_after_one_window(actors):
    ray, (quick, slow, _) = actors
    refs = [quick.answer.remote(), slow.hold.remote()]
    assert liveness.silent(ray, refs, ["here", "there"], "here") == [1]
    assert liveness.silent(ray, refs, ["here", "there"], "here", heard=lambda quiet, answered: set()) == [1]


def test_an_actor_of_the_drivers_node_or_a_poll_nobody_answered_is_never_judged(actors):
    ray, (quick, slow, _) = actors
    assert liveness.silent(ray, [quick.answer.remote(), slow.hold.remote()], ["here", "here"], "here") == []
    assert liveness.silent(ray, [quick.hold.remote(), slow.hold.remote()], ["there", "there"], "here") == []


def test_a_quiet_actor_whose_host_mate_answered_gets_one_more_window(actors):
    """A host cut off, frozen or lost silences all of its actors at once: one that answered is a
    sign of life, worth one more window, not more."""
    ray, (quick, slow, mate) = actors
    asked = []
    refs = [quick.answer.remote(), slow.hold.remote(), mate.answer.remote()]
    assert liveness.silent(ray, refs, ["here", "there", "there"], "here",
                           heard=lambda quiet, answered: asked.append((quiet, answered)) or set()) == [1]
    assert asked == [([1], [0, 2])]  # asked after its second window: the first was its mate's


def test_a_host_none_of_whose_actors_answered_is_named_after_one_window(actors):
    ray, (quick, slow, mate) = actors
    asked = []
    refs = [quick.answer.remote(), slow.hold.remote(), mate.hold.remote()]
    assert liveness.silent(ray, refs, ["here", "there", "there"], "here",
                           heard=lambda quiet, answered: asked.append((quiet, answered)) or set()) == [1, 2]
    assert asked == [([1, 2], [0])]
