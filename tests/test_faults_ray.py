"""Faults under Ray end the job with an error naming the replica, the instruction and the cause;
the pool is repaired and the next job in the same driver works. Strangers on an actor's socket do
not disturb a job; a refused peer message fails it, naming the replica."""

from __future__ import annotations

import _thread
import contextlib
import gc
import glob
import os
import sys
import tempfile
import threading
from collections.abc import Callable

import numpy as np
import pytest

import replicas as rp
from replicas.ops.custom_call import unregister_custom_call
from replicas.runtime.ray.actor_pool import _options_key
from replicas.runtime.ray.backend import _AUTHKEY, POOL
from replicas.transport.wire import Wire, WireError

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.ray]


def setup_module(module):
    # The custom calls below are this module's functions: the actors cannot import tests/.
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(module)

@pytest.fixture(autouse=True)
def no_object_of_the_job_stays_pinned():
    """After each fault: neither the driver nor an idle pooled actor holds a reference to any object
    of the job (the object store keeps an object while some process holds a reference)."""
    import ray

    def driver_refs() -> set[str]:
        return set(ray._private.worker.global_worker.core_worker.get_all_reference_counts())  # noqa: SLF001

    before = driver_refs()
    yield
    POOL.settle()  # the resets of an aborted job's actors (the job did not wait for them): their refs
    gc.collect()
    assert _eventually(lambda: driver_refs() <= before), driver_refs() - before
    held = {}
    for actor in [a for actors in POOL._idle.values() for a in actors]:  # noqa: SLF001
        try:
            held[actor] = ray.get(actor.object_refs.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            pass  # killed while idle (a test's fault): it holds nothing, and the next job replaces it
    assert not any(held.values()), held


CALL = """\
HloModule call, replica_count=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[4] parameter(0)
  id = u32[] replica-id()
  y = f32[4] custom-call(x, id), custom_call_target="fault"
  ROOT z = f32[4] all-reduce(y), replica_groups={}, to_apply=add
}
"""

FED = """\
HloModule fed, replica_count=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  tok = token[] after-all()
  in = (f32[4], token[]) infeed(tok)
  x = f32[4] get-tuple-element(in), index=0
  t2 = token[] get-tuple-element(in), index=1
  out = token[] outfeed(x, t2), outfeed_shape=f32[4]
  ROOT z = f32[4] all-reduce(x), replica_groups={}, to_apply=add
}
"""

X = np.arange(4, dtype=np.float32)


def _flag_path(tmp_path) -> str:
    return str(tmp_path / "go")


def run_with(fault, **kwargs):
    """Run CALL with custom call `fault(x, id)` on 2 replicas."""
    rp.register_custom_call("fault", fault)
    try:
        return rp.run(rp.parse_hlo(CALL), [X], num_replicas=2, **kwargs)
    finally:
        unregister_custom_call("fault")


def healthy(x, rid):
    return x


def assert_next_job_works():
    results = run_with(healthy, timeout=60)
    np.testing.assert_array_equal(results[1], 2 * X)


def test_a_pooled_actor_that_died_while_idle_is_replaced():
    import ray

    rp.register_custom_call("fault", healthy)
    try:
        with rp.launch(rp.parse_hlo(CALL), [X], num_replicas=2, timeout=60) as job:
            job.result()
    finally:
        unregister_custom_call("fault")
    # Its actors are idle in the pool now, on top of their stack: the next job of the same shape
    # takes them first. Only they die (the pool's other actors serve the tests after this one: a
    # fresh actor costs a process start).
    killed = list(job._backend._actors)  # noqa: SLF001
    stack = POOL._idle[_options_key(job._backend._options[0])]  # noqa: SLF001
    assert {a._actor_id for a in killed} == {a._actor_id for a in stack[-len(killed):]}
    for actor in killed:
        ray.kill(actor, no_restart=True)
    assert_next_job_works()  # took the dead ones, and replaced them
    assert not {a._actor_id for a in killed} & {a._actor_id for a in stack}
    # What the driver remembers of actors (addresses, programs) is of pooled ones only: the dead
    # ones the job replaced are forgotten.
    pooled = {a._actor_id for actors in POOL._idle.values() for a in actors}
    assert set(POOL._notes) <= pooled


def _replica_one(action):
    def fault(x, rid):
        if int(rid) == 1:
            action()
        return x
    return fault


def _exit():
    os._exit(3)


def _segfault():
    import ctypes

    ctypes.string_at(0)


@pytest.mark.parametrize("action", [_exit, _segfault], ids=["os._exit", "segfault"])
def test_an_actor_that_dies_in_a_custom_call_is_named(action):
    with pytest.raises(rp.ReplicaFailure) as info:
        run_with(_replica_one(action), timeout=60)
    assert info.value.replica == 1
    assert "replica 1" in str(info.value) and "died" in str(info.value)
    assert_next_job_works()


FED_THEN_CALL = """\
HloModule fed_then_call, replica_count=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  tok = token[] after-all()
  in = (f32[4], token[]) infeed(tok)
  x = f32[4] get-tuple-element(in), index=0
  id = u32[] replica-id()
  y = f32[4] custom-call(x, id), custom_call_target="fault"
  ROOT z = f32[4] all-reduce(y), replica_groups={}, to_apply=add
}
"""


@pytest.mark.parametrize("per_actor", [1, 2], ids=["an actor each", "one actor"])
@pytest.mark.parametrize("action", [_exit, _segfault], ids=["os._exit", "segfault"])
def test_a_dead_actor_names_the_instruction_each_replica_was_in_not_the_last_poll(action, per_actor):
    """The driver's last poll saw replica 1 blocked in its infeed; fed, it died in the custom call
    %y at once: the error names %y for it (read from the slots its process published), and for
    the other replica of the same actor the infeed it still waits in."""
    rp.register_custom_call("fault", _replica_one(action))
    try:
        job = rp.launch(rp.parse_hlo(FED_THEN_CALL), [], num_replicas=2, replicas_per_actor=per_actor, timeout=60)
        # The last poll: both in %in (infeed); replica 0 is named from it when it shares the actor.
        assert _eventually(lambda: all(s.status == "blocked" for s in job.states()))
        job.infeed(1, X)
        with pytest.raises(rp.ReplicaFailure) as info:
            job.result()
    finally:
        unregister_custom_call("fault")
    assert info.value.replica == 1 and info.value.instruction.startswith("%y (custom-call"), str(info.value)
    assert "replica 1 died while running %y (custom-call" in str(info.value)
    if per_actor == 2:
        assert "replica 0 while blocked in %in (infeed" in str(info.value), str(info.value)
    assert_next_job_works()


def _raise():
    raise ValueError("the custom call refuses")


def test_a_custom_call_that_raises_names_the_replica_instruction_and_cause():
    big = np.ones(1 << 20, np.float32)  # 4 MiB per replica: the arguments go through the object store
    rp.register_custom_call("fault", _replica_one(_raise))
    try:
        with pytest.raises(rp.ReplicaFailure, match="the custom call refuses") as info:
            rp.run(rp.parse_hlo(CALL.replace("f32[4]", "f32[1048576]")), [big], num_replicas=2, timeout=60)
    finally:
        unregister_custom_call("fault")
    assert info.value.replica == 1 and info.value.instruction.startswith("%y (custom-call")
    assert "ValueError" in str(info.value)


def _memory():
    raise MemoryError("pretend the actor ran out")


def test_a_custom_call_out_of_memory_fails_the_replica_and_its_actor_is_not_pooled():
    rp.register_custom_call("fault", _replica_one(_memory))
    try:
        job = rp.launch(rp.parse_hlo(CALL), [X], num_replicas=2, timeout=60)
        with pytest.raises(rp.ReplicaFailure, match="MemoryError") as info:
            job.result()
    finally:
        unregister_custom_call("fault")
    assert info.value.replica == 1 and info.value.instruction.startswith("%y (custom-call")
    idle = [a for actors in POOL._idle.values() for a in actors]  # noqa: SLF001
    assert job._backend._actor_of[1] not in idle and job._backend._actor_of[0] in idle  # noqa: SLF001
    assert_next_job_works()


def test_a_replica_that_never_returns_times_out_naming_it_and_its_actor_is_replaced():
    def never(x, rid):
        if int(rid) == 0:
            threading.Event().wait()  # never set
        return x

    with pytest.raises(rp.ExecutionTimeout) as info:
        run_with(never, timeout=2)
    assert "replica 0: running %y (custom-call)" in str(info.value)
    assert_next_job_works()


def test_a_killed_actor_is_named_with_what_it_was_doing():
    import ray

    job = rp.launch(rp.parse_hlo(FED), [], num_replicas=2, timeout=60)
    assert _eventually(lambda: job.states()[0].status == "blocked")  # in its infeed (it may still be starting)
    ray.kill(job._backend._actor_of[0], no_restart=True)  # noqa: SLF001 - the fault under test
    with pytest.raises(rp.ReplicaFailure) as info:
        job.result()
    assert info.value.replica == 0 and "infeed" in str(info.value)
    assert_next_job_works()


def test_outfeed_values_written_before_a_failure_stay_readable():
    job = rp.launch(rp.parse_hlo(FED), [], num_replicas=2, timeout=60)
    job.infeed(1, X)  # replica 1 writes its outfeed, then waits in the all-reduce
    assert _eventually(lambda: _blocked_in(job.states()[1], "all-reduce"))
    job.cancel()
    np.testing.assert_array_equal(job.outfeed(1), X)
    with pytest.raises(rp.ReplicasError, match="no more outfeed"):
        job.outfeed(1)


HOST_SEND = """\
HloModule host_send, replica_count=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[4] parameter(0)
  tok = token[] after-all()
  s = (f32[4], u32[], token[]) send(x, tok), channel_id=5, is_host_transfer=true
  d = token[] send-done(s), channel_id=5, is_host_transfer=true
  in = (f32[4], token[]) infeed(d)
  y = f32[4] get-tuple-element(in), index=0
  ROOT z = f32[4] all-reduce(y), replica_groups={}, to_apply=add
}
"""


def test_host_channel_messages_sent_before_an_actor_died_stay_readable():
    import ray

    job = rp.launch(rp.parse_hlo(HOST_SEND), [X], num_replicas=2, timeout=60)
    assert _eventually(lambda: all(_blocked_in(s, "infeed") for s in job.states()))  # both sent, then wait
    ray.kill(job._backend._actor_of[0], no_restart=True)  # noqa: SLF001 - the fault under test
    with pytest.raises(rp.ReplicaFailure) as info:
        job.result()
    assert info.value.replica == 0
    np.testing.assert_array_equal(job.recv(1, 5), X)  # the live replica's message, read after the fault
    with pytest.raises(rp.ReplicaFailure):
        job.recv(1, 5)  # nothing more: the job's failure


def test_resources_no_node_has_fail_at_once_naming_the_resource():
    with pytest.raises(rp.ReplicaFailure, match="no node has no_such_accelerator=1"):
        rp.run(rp.parse_hlo(CALL), [X], num_replicas=2, resources=[{"no_such_accelerator": 1}, {}], timeout=60)


def test_replicas_that_cannot_be_placed_in_time_end_within_the_timeout():
    import ray

    cpus = ray.cluster_resources()["CPU"]
    with pytest.raises(rp.ExecutionTimeout, match="did not start within timeout=1.5 s"):
        # Each asks for every CPU of the only node: the second can never start while the first runs.
        run_with(healthy, timeout=1.5, resources=[{"CPU": cpus}, {"CPU": cpus}])
    assert_next_job_works()


def test_a_full_node_ends_the_start_within_the_timeout_naming_the_resource():
    import ray

    free = ray.available_resources().get("CPU", 0)
    holder = ray.remote(num_cpus=free)(_Holder).remote()  # takes every free CPU of the session
    try:
        assert ray.get(holder.ping.remote(), timeout=60)
        with pytest.raises(rp.ExecutionTimeout, match=r"did not start within timeout=1.5 s.*asks for CPU=1 \(0 free"):
            run_with(healthy, timeout=1.5, resources=[{"CPU": 1}, {"CPU": 1}])
    finally:
        ray.kill(holder, no_restart=True)
    assert_next_job_works()


class _Holder:
    def ping(self) -> bool:
        return True


def test_strangers_on_an_actor_socket_and_replayed_messages_do_not_disturb_a_job():
    import socket

    job = rp.launch(rp.parse_hlo(FED), [], num_replicas=2, timeout=60)
    address = job._backend._get([job._backend._actor_of[0].wire_address.remote(_AUTHKEY)])[0]  # noqa: SLF001
    strangers = []
    for payload in (b"", os.urandom(100), b"rpw1" + b"\0" * 64):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address["unix"])
        s.sendall(payload)
        strangers.append(s)
    # A keyed sender replaying an earlier job's message (old token): dropped.
    insider = Wire(lambda m: None, _AUTHKEY, address["node"])
    insider.send(address, ("an-earlier-job", 0, 1, ("ar", 0), X))
    job.infeed(0, X)
    job.infeed(1, X)
    results = job.result()
    np.testing.assert_array_equal(results[0], 2 * X)
    for s in strangers:
        s.close()
    insider.close()


def test_a_malformed_message_from_a_key_holder_fails_the_job_naming_the_replica():
    job = rp.launch(rp.parse_hlo(FED), [], num_replicas=2, timeout=60)
    backend = job._backend  # noqa: SLF001
    address = backend._get([backend._actor_of[0].wire_address.remote(_AUTHKEY)])[0]
    insider = Wire(lambda m: None, _AUTHKEY, address["node"])
    insider.send(address, (backend._token, 99, 1, ("ar", 0), X))  # a replica that actor does not run
    with pytest.raises(rp.ReplicaFailure, match="does not run") as info:
        job.result()
    assert info.value.replica == 0
    insider.close()
    assert_next_job_works()


def _hostile_messages(token):
    """Messages from a key holder that FED (one all-reduce of f32[4] on 2 replicas) never expects."""
    from replicas.transport.shm import Shared, ShmArray, segment_name

    huge = ShmArray(segment_name(token, 1), 0, 0, (1 << 40,), np.dtype(np.float32))
    return {
        "over the collective": ((token, 0, 1, ("coll", 0, 0), np.zeros(1 << 18, np.float32)),
                                r"replica 1 sent 1 MiB .* under \('coll', 0, 0\), where the program expects at most"),
        "no such channel": ((token, 0, 1, ("chan", 7, 0), X), "program sends nothing on channel 7"),
        "no such protocol": ((token, 0, 1, ("infeed", 0), X), "names no collective or channel"),
        "shared memory over the collective": ((token, 0, 1, ("coll", 0, 0), Shared(("fp", huge))),
                                              "replica 1 sent 4 TiB"),
        "object store over the collective": ((token, 0, 1, ("coll", 0, 0), ("fp", np.zeros(1 << 18, np.float32))),
                                             r"replica 1's actor \(through the object store\).*replica 1 sent 1 MiB"),
    }


@pytest.mark.parametrize("kind", ["over the collective", "no such channel", "no such protocol",
                                  "shared memory over the collective", "object store over the collective"])
def test_a_message_over_what_the_program_expects_is_refused_naming_its_sender(kind):
    job = rp.launch(rp.parse_hlo(FED), [], num_replicas=2, timeout=60)
    backend = job._backend  # noqa: SLF001
    address = backend._get([backend._actor_of[0].wire_address.remote(_AUTHKEY)])[0]
    message, expected = _hostile_messages(backend._token)[kind]
    insider = Wire(lambda m: None, _AUTHKEY, address["node"])
    if kind.startswith("object store"):
        backend._actor_of[0].deliver.remote(*message)
    else:
        try:
            insider.send(address, message)
        except WireError:
            pass  # the receiver closed the connection before the whole body was written: never blocked
    with pytest.raises(rp.ReplicaFailure, match=expected) as info:
        job.result()
    assert info.value.replica == 0
    assert kind.startswith("object store") or f"peer process {os.getpid()}" in str(info.value)
    insider.close()
    if kind == "over the collective":
        assert_next_job_works()


def test_exception_in_with_block_ctrl_c_and_two_threads():
    m = rp.parse_hlo(FED)
    with pytest.raises(ValueError), rp.launch(m, [], num_replicas=2, timeout=None):
        raise ValueError("user code failed")
    # Ctrl-C while waiting for a job: the job is cancelled and KeyboardInterrupt propagates.
    job = rp.launch(m, [], num_replicas=2, timeout=None)

    # Never waiting within the limit (a start slower than that): the job ends rather than hang the run.
    with interrupted_in("_wait", "job.py", limit=300, otherwise=job.cancel):  # the interrupt lands there
        job.result()
    with pytest.raises(rp.ReplicasError, match="interrupted"):
        job.result()
    # Two jobs from two threads of one driver.
    out: dict[int, list] = {}
    errors: list[BaseException] = []

    def one(k):
        try:
            out[k] = run_with(healthy, timeout=300) if k == 0 else rp.run(
                rp.parse_hlo(CALL.replace('"fault"', '"healthy2"')), [X], num_replicas=2, timeout=300)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    rp.register_custom_call("healthy2", healthy)
    try:
        threads = [threading.Thread(target=one, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(360)
    finally:
        unregister_custom_call("healthy2")
    assert not errors and all(np.array_equal(out[k][0], 2 * X) for k in range(2))


def test_no_socket_folders_are_left_in_the_temp_dir():
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "rpw-*")))
    assert_next_job_works()
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "rpw-*"))) <= before


def _blocked_in(state, opcode: str) -> bool:
    """One snapshot read once: a second `states()` call may see the replica unblocked already."""
    return state.status == "blocked" and state.block is not None and state.block.opcode == opcode


def _eventually(predicate, limit: float = 30) -> bool:
    import time

    event = threading.Event()
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if predicate():
            return True
        event.wait(0.05)
    return False


@contextlib.contextmanager
def interrupted_in(function: str, filename: str, limit: float = 30, otherwise: Callable[[], None] | None = None):
    """Ctrl-C (`_thread.interrupt_main`) once the main thread is inside `function` of `filename`,
    while the block runs, which must raise KeyboardInterrupt; `otherwise()` when it never gets there
    within `limit` s. Without garbage collection meanwhile: a gc callback (JAX registers one) would
    swallow an interrupt raised while it runs, and the block would go on."""

    def interrupt():
        if _eventually(lambda: main_thread_in(function, filename), limit=limit):
            _thread.interrupt_main()
        elif otherwise is not None:
            otherwise()

    threading.Thread(target=interrupt, daemon=True).start()
    gc.disable()
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        gc.enable()


def main_thread_in(function: str, filename: str) -> bool:
    """The main thread is inside `function` of `filename` (so an interrupt lands there, not in the test)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        if frame.f_code.co_name == function and frame.f_code.co_filename.endswith(filename):
            return True
        frame = frame.f_back
    return False
