"""How a job's replicas are grouped into Ray actors (runtime/ray/placement.py): replicas asking for
the same resources share actors, never replicas of another host, and an actor never asks for more
than the one node offering those resources holds."""

from replicas.runtime.ray.placement import actor_groups

HOSTS = [{"Alive": True, "Resources": {"CPU": 1.0, "host0": 1000.0}},
         {"Alive": True, "Resources": {"CPU": 1.0, "host1": 1000.0}}]


def by_host(n: int) -> list[dict[str, float]]:
    return [{f"host{r % 2}": 1} for r in range(n)]


def test_replicas_of_one_host_share_its_cpus_actors():
    assert actor_groups(4, by_host(4), 0, False, HOSTS) == [[0, 2], [1, 3]]
    assert actor_groups(8, by_host(8), 0, False, HOSTS) == [[0, 2, 4, 6], [1, 3, 5, 7]]  # one CPU a host
    wide = [{"Alive": True, "Resources": {"CPU": 2.0, f"host{h}": 1000.0}} for h in (0, 1)]
    assert actor_groups(8, by_host(8), 0, False, wide) == [[0, 2], [1, 3], [4, 6], [5, 7]]  # an actor a CPU
    assert actor_groups(4, by_host(4), 0, False, wide) == [[0], [1], [2], [3]]
    # a persistent job (rp.jax.jit's): one actor per host, as without resources one actor in all
    assert actor_groups(8, by_host(8), 0, True, HOSTS) == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_an_explicit_count_is_kept_within_each_host():
    assert actor_groups(4, by_host(4), 1, False, HOSTS) == [[0], [1], [2], [3]]
    assert actor_groups(8, by_host(8), 3, True, HOSTS) == [[0, 2, 4], [1, 3, 5], [6], [7]]


def test_replicas_stay_apart_where_no_single_node_or_not_enough_of_it_offers_their_resources():
    assert actor_groups(2, [{"CPU": 1}, {"CPU": 1}], 0, True, HOSTS) == [[0], [1]]  # every node offers CPUs
    scarce = [{"Alive": True, "Resources": {"CPU": 4.0, "node1": 1.0}}]
    assert actor_groups(2, [{"node1": 1}] * 2, 0, True, scarce) == [[0], [1]]  # room for one replica's ask
    assert actor_groups(2, [{"gone": 1}] * 2, 0, True, HOSTS) == [[0], [1]]  # nowhere: unplaceable, as before
    dead = [dict(HOSTS[0], Alive=False), HOSTS[1]]
    assert actor_groups(2, [{"host0": 1}] * 2, 0, True, dead) == [[0], [1]]


def test_without_resources_consecutive_replicas_share_actors():
    assert actor_groups(5, None, 2, False, None) == [[0, 1], [2, 3], [4]]
