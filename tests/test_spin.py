"""The bounded, adaptive spin before a shared-memory wait sleeps (transport/spin.py), and the mailbox's
wake-up of its replica (a lock used as a binary semaphore)."""

from __future__ import annotations

import threading

import pytest

from replicas.records import BlockInfo
from replicas.transport import spin
from replicas.transport.mailbox import Mailbox
from replicas.tuning.cores import cores


def test_the_budget_follows_the_processes_and_the_environment(monkeypatch):
    monkeypatch.delenv(spin.ENV, raising=False)
    assert spin.budget_for(1) == spin.BUDGET
    assert spin.budget_for(cores()) == spin.BUDGET
    assert spin.budget_for(cores() + 1) == 0.0  # more of the job's processes than cores: never spin
    monkeypatch.setenv(spin.ENV, "0")
    assert spin.budget_for(1) == 0.0
    monkeypatch.setenv(spin.ENV, "250")
    assert spin.budget_for(cores() + 1) == pytest.approx(250e-6)
    monkeypatch.setenv(spin.ENV, "soon")
    with pytest.raises(ValueError, match=spin.ENV):
        spin.budget_for(1)


def test_a_spin_ends_as_soon_as_the_word_changes():
    spinner = spin.Spinner(10.0)  # a budget it never reaches: the change ends it
    polls = iter([False, False, True])
    assert spinner.spin(lambda: next(polls))
    assert (spinner.spins, spinner.hits) == (1, 1)


def test_failed_spins_in_a_row_make_it_rest_then_try_again():
    spinner = spin.Spinner(1e-9)
    calls = [0]

    def never() -> bool:
        calls[0] += 1
        return False

    for _ in range(spin._FAILURES):
        assert not spinner.spin(never)
    assert spinner.spins == spin._FAILURES
    before = calls[0]
    for _ in range(spin._REST):
        assert not spinner.spin(never)  # resting: returns at once, polls nothing
    assert calls[0] == before and spinner.spins == spin._FAILURES
    assert not spinner.spin(never)  # rested: spins again
    assert spinner.spins == spin._FAILURES + 1
    assert spinner.spin(lambda: True) and spinner.hits == 1


def test_an_observed_spinner_spins_while_its_recent_waits_were_within_the_budget():
    spinner = spin.Spinner(1e-3)
    polls = [0]

    def changed() -> bool:
        polls[0] += 1
        return True

    assert spinner.spin(changed) and polls[0] == 1  # nothing observed yet: it spins
    spinner.observed(1e-5)
    spinner.observed(1.0)  # one long wait among short ones (a pause between calls): still spins
    spinner.observed(1e-5)
    assert spinner.spin(changed) and polls[0] == 2
    spinner.observed(1.0)
    spinner.observed(1.0)  # mostly long: a spin would not pay, it sleeps at once
    assert not spinner.spin(changed) and polls[0] == 2
    spinner.observed(1e-5)
    spinner.observed(1e-5)  # short again: it spins again
    assert spinner.spin(changed) and polls[0] == 3

    short = spin.Spinner(1e-9)  # failed spins do not make an observed spinner rest
    for _ in range(4 * spin._FAILURES):
        short.observed(0.0)
        assert not short.spin(lambda: False)
    assert short.spins == 4 * spin._FAILURES


def test_it_rests_when_fewer_than_half_the_spins_pay():
    spinner = spin.Spinner(1e-9)
    outcomes = iter([True, False, False] * spin._FAILURES)
    rested = False
    for _ in range(3 * spin._FAILURES):
        before = spinner.spins
        spinner.spin(lambda: next(outcomes))
        rested = rested or spinner.spins == before
        if rested:
            break
    assert rested  # one hit in three: failures outran the hits

    steady = spin.Spinner(1e-9)
    pattern = iter([True, False] * 4 * spin._FAILURES)
    for _ in range(8 * spin._FAILURES):
        steady.spin(lambda: next(pattern))
    assert steady.spins == 8 * spin._FAILURES  # every other spin pays: it never rests


def test_never_spins():
    assert not spin.NEVER.spin(lambda: True)
    assert spin.NEVER.spins == 0


def _block() -> BlockInfo:
    return BlockInfo("recv", "r", "recv", needs="all", waits_for=(1,))


def test_a_delivery_wakes_the_waiting_replica_once_everything_it_waits_for_is_there():
    box = Mailbox(0)
    got: list = []
    waiting = threading.Event()

    def take() -> None:
        waiting.set()
        got.extend(box.take_all([(1, "a"), (2, "b")], _block()))

    t = threading.Thread(target=take)
    t.start()
    waiting.wait()
    box.deliver(1, "a", 10)
    box.deliver(2, "b", 20)
    t.join(10)
    assert not t.is_alive() and got == [10, 20]
    # Every wait starts from a clean semaphore, whatever the last one left: a second and third round.
    for value in (30, 40):
        t = threading.Thread(target=lambda: got.append(box.take(1, "c", _block())))
        t.start()
        box.deliver(1, "c", value)
        t.join(10)
        assert not t.is_alive() and got[-1] == value


def test_an_abort_wakes_the_waiting_replica():
    box = Mailbox(0)
    errors: list = []

    def take() -> None:
        try:
            box.take(1, "never", _block())
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=take)
    t.start()
    while box.snapshot().status != "blocked":
        t.join(0.001)
    box.abort(RuntimeError("stop"))
    t.join(10)
    assert not t.is_alive() and str(errors[0]) == "stop"


def test_a_snapshot_during_an_outside_wait_that_polls_the_mailbox_returns():
    """The monitor's snapshot asks an outside wait's `ready()` under the mailbox's lock; a ready()
    that polls the same mailbox (the channel rings' does) must not deadlock it."""
    box = Mailbox(0)
    release = threading.Event()
    done = threading.Event()

    def wait() -> None:
        box.wait_external(_block(), lambda: box.poll(1, "x"), lambda t: release.wait(0.01), release.set)
        done.set()

    t = threading.Thread(target=wait)
    t.start()
    while box.snapshot().status != "blocked":
        t.join(0.001)
    box.deliver(1, "x", 1)
    assert box.snapshot().status == "running"  # what it waits for is there: not blocked
    t.join(10)
    assert done.is_set()


def test_a_watched_memoryview_word_ends_the_spin_when_it_changes_and_then_holds():
    class Word:
        """A doorbell word a peer bumps between every two reads (as a busy writer would)."""

        def __init__(self) -> None:
            self.value = 0

        def __getitem__(self, index: int) -> int:
            self.value += 1
            return self.value

    changes = []

    def ready() -> bool:
        changes.append(1)
        return len(changes) == 2  # the first change is not yet what the waiter needs

    spinner = spin.Spinner(10.0)  # a budget it never reaches: the second change ends it
    assert spinner.watch_words(Word(), 1, ready)
    assert len(changes) == 2 and (spinner.spins, spinner.hits) == (1, 1)
    assert not spin.NEVER.watch_words(Word(), 1, ready)

    released = memoryview(bytearray(16)).cast("I")
    released.release()  # its segment closed: the spin ends and the caller's wait sees why
    assert spin.Spinner(10.0).watch_words(released, 0, ready)
