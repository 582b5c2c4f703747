"""The states a Ray actor publishes, sent as columns (`runtime/ray/state_columns.py`): the driver
decodes exactly the states the actor encoded, whatever their statuses and blocks."""

from __future__ import annotations

import pickle

from replicas.records import HOST, BlockInfo, ReplicaState
from replicas.runtime.ray import state_columns


def test_the_driver_decodes_the_very_states_an_actor_encoded():
    group = tuple(range(8))
    states = [
        ReplicaState(0, "running", None, "%add.3 (add)", 4, 2, 3, None, 1, "n1"),
        ReplicaState(1, "blocked", BlockInfo("collective", "y", "all-reduce", needs="group", group=group, seq=5,
                                             computation="body"), None, 9, 7, 7, None, 6, "n1"),
        ReplicaState(2, "blocked", BlockInfo("collective", "y", "all-reduce", needs="group", group=group, seq=5,
                                             computation="body"), None, 9, 7, 7, None, 6, "n1"),
        ReplicaState(3, "blocked", BlockInfo("recv-done", "got", "recv-done", waits_for=(2,), needs="one",
                                             channel_id=3, seq=0), None, 1, 0, 1, None, 0, "n1"),
        ReplicaState(4, "blocked", BlockInfo("infeed", "in", "infeed", waits_for=(HOST,)), None, 0, 0, 0, None, 0,
                     "n1"),
        ReplicaState(5, "finished", None, None, 12, 8, 8, None, 8, "n1"),
        ReplicaState(6, "failed", None, None, 3, 1, 1, "ReplicaFailure: boom", 2, "n1"),
        ReplicaState(7, "cancelled", None, None, 3, 1, 1, "ReplicasError: job stopped", 2, "n2"),
    ]
    columns = pickle.loads(pickle.dumps(state_columns.encode(states)))  # as Ray carries them
    decoded = state_columns.decode(columns)
    assert decoded == states
    assert [list(s.__dict__) for s in decoded] == [list(s.__dict__) for s in states]
    assert decoded[1].block is decoded[2].block  # blocked alike: one entry of the table
    assert decoded[1].block.group is decoded[2].block.group
    assert state_columns.decode(state_columns.encode([])) == []


def test_a_status_the_columns_do_not_know_still_arrives():
    states = [ReplicaState(0, "paused", None, None, 1, 0, 0, None, 0, None)]
    assert state_columns.decode(state_columns.encode(states)) == states
