"""The suite on two pytest-xdist workers (the machines it runs on have two cores; the time it takes
is mostly one process waiting for its own work), with the constraints a plain load balancer breaks:

- every test that uses this run's Ray session (`ray_session`, the `ray` marker) runs on one worker,
  so a run starts one Ray;
- the README's Python blocks and the tests on the two-node cluster share session fixtures (the
  `workdir` the blocks ran in, the cluster), so they run on one worker, in collection order (the
  tests that break the cluster last);
- the rest is balanced test by test, the slow ones first, so the run does not end on a long test.

The worker that collects writes each test's group to a file the controller names; the scheduler
reads it once every worker has collected. `-p no:xdist`, `-n 0` or any `-n`/`--dist` of the user's
turn this off (the groups only order the tests then).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPS_KEY = "replicas_test_groups"


def wants_workers(config: pytest.Config) -> int:
    """How many workers this run gets by default: two for the whole suite on a machine with two
    cores or more, none when the user chose (`-n`, `--dist`, `--tx`), selected files (starting
    workers costs more than a few files take) or only collects."""
    option = config.option
    if "PYTEST_XDIST_WORKER" in os.environ or hasattr(config, "workerinput"):
        return 0
    if option.numprocesses is not None or option.dist != "no" or option.tx:
        return 0
    if option.collectonly or option.usepdb or not runs_whole_suite(config):
        return 0
    count = os.environ.get("REPLICAS_TEST_WORKERS")
    if count is not None:
        return int(count)
    return 2 if (os.cpu_count() or 1) >= 2 else 0


def runs_whole_suite(config: pytest.Config) -> bool:
    """`pytest` with no arguments, in the repository (which reads `testpaths`) or in tests/ (where
    pytest collects the invocation directory: the same tests)."""
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        return True
    if config.args_source != pytest.Config.ArgsSource.INVOCATION_DIR:
        return False
    here = Path(config.invocation_params.dir).resolve()
    return any(here == (config.rootpath / path).resolve() for path in config.getini("testpaths"))


class GroupScheduling(LoadScopeScheduling):
    """LoadScopeScheduling whose scopes are the groups above (a test of no group is its own scope),
    the groups handed out first, then the slow tests."""

    def __init__(self, config: pytest.Config, groups_file: Path, log: Any = None) -> None:
        super().__init__(config, log)
        self.groups_file = groups_file
        self.scope_of: dict[str, str] = {}

    def _split_scope(self, nodeid: str) -> str:
        return self.scope_of.get(nodeid, nodeid)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        """As LoadScopeScheduling's, but a finished scope leaves the node's assigned work: its
        `_reschedule` counts the pending tests of every scope the node ever got after each test
        (~1,000 one-test scopes per worker here: 0.4 -> 0.13 CPU s of the controller for 2,115
        tests). Only pending scopes matter to the rest (a crashed node's are queued again)."""
        nodeid = self.registered_collections[node][item_index]
        work = self.assigned_work[node]
        scope = self._split_scope(nodeid)
        work[scope][nodeid] = True
        if all(work[scope].values()):
            del work[scope]
        self._reschedule(node)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        info = json.loads(self.groups_file.read_text())
        self.scope_of = {nodeid: "group:" + group for nodeid, group in info["groups"].items()}
        slow = set(info["slow"])
        units: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        # Largest first: the groups (the in-process Ray group is the largest), then slow tests.
        rank = {"group:ray": 0, "group:subprocess": 1}

        def order(item: tuple[int, tuple[str, dict[str, bool]]]) -> tuple[int, int]:
            index, (scope, _) = item
            return (rank.get(scope, 2 if scope in slow else 3), index)

        self.workqueue = OrderedDict(unit for _, unit in sorted(enumerate(units.items()), key=order))
        for _ in range(len(self.nodes) - len(self.workqueue)):  # more workers than work
            unused, _work = self.assigned_work.popitem()
            unused.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()


class Controller:
    """The controller's side: the scheduler, and where the workers write the groups."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @property
    def groups_file(self) -> Path:
        return self.config._tmp_path_factory.getbasetemp() / "test-groups.json"

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> GroupScheduling:
        return GroupScheduling(config, self.groups_file, log)

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[GROUPS_KEY] = str(self.groups_file)

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        computed = getattr(node, "workeroutput", {}).get("oracle_computed", 0)
        self.config.oracle_computed_by_workers = getattr(self.config, "oracle_computed_by_workers", 0) + computed


def write_groups(config: pytest.Config, groups: dict[str, str], slow: list[str]) -> None:
    """On a worker: the groups of the collected tests, for the controller's scheduler."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or GROUPS_KEY not in workerinput:
        return
    path = Path(workerinput[GROUPS_KEY])
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"groups": groups, "slow": slow}))
    tmp.replace(path)  # every worker writes the same; the scheduler never reads a torn file
