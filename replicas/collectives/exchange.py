"""`Exchange`: the messages of one collective on one replica, over whatever transport the fabric
offers (fabric messages, the in-process meeting, the same-node board); the algorithms
(`collectives/selector.py`) speak only to it. Where the members live and who leads them:
`collectives/topology.py`.

Every message carries the sender's fingerprint next to the payload, and the receiver compares
it before it uses anything (in-process, the very same tuple: an identity check); at a meeting every
fingerprint is compared with the first member's before the operand is left (`Mailbox.meet`). Keys
are `keys.collective(seq, round)`, with the rounds of `collectives/topology.py`; they do not depend on the kind of
collective, so a replica that reached a different collective still sends under the same key (or
arrives at the same meeting) and the mismatch is reported instead of waiting forever.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from replicas.collectives.buffers import pool_of
from replicas.collectives.fingerprint import Fingerprint, diff, mismatch_error
from replicas.collectives.reduction import copy_all
from replicas.collectives.selector import THRESHOLDS, Algorithm, Situation, plan
from replicas.collectives.topology import DEPOSIT, LEADER_ROUND, RESULT, RESULT_LANES, Topology
from replicas.records import BlockInfo
from replicas.transport import board as shared_board
from replicas.transport import futex, keys, shm
from replicas.transport.wire import payload_bytes
from replicas.tuning import workers

if TYPE_CHECKING:
    from replicas.transport.fabric import Fabric
    from replicas.transport.mailbox import Mailbox

_VIA_FABRIC = object()  # a board buffer announcing that its payload follows as a message


class Exchange:
    """The messages of one collective on one replica: one per call site and job, numbered anew by each
    call (`kernels.Collective.run` sets `seq` and `block`; a replica runs one collective at a time)."""

    __slots__ = ("fabric", "seq", "me", "fingerprint", "block", "topo", "_reads", "meeting", "_boxes",
                 "algorithm", "_plans")

    def __init__(self, fabric: Fabric, seq: int, fingerprint: Fingerprint, block: BlockInfo | None,
                 topo: Topology | None, meeting: Mailbox | None = None) -> None:
        # The fabric itself, not the interpreter's `FabricSlot` (whose every attribute is a forwarding
        # call, and a collective reads a dozen): `kernels.Collective` unwraps it once per call.
        self.fabric = fabric
        self.seq = seq
        self.me = fabric.replica_id
        self.fingerprint = fingerprint
        self.block = block
        # Where the group's members live (group collectives only; point-to-point ones have none). An
        # attribute, not a checking property: an algorithm reads it several times per call.
        self.topo: Topology = topo  # type: ignore[assignment]
        self._reads: list[shared_board.Read] = []
        # The mailbox the process's members meet on when the last to arrive leads (None: the first
        # local member leads); on the acting leader, the members' mailboxes by rank.
        self.meeting = meeting
        self._boxes: list[Mailbox] | None = None
        # The unit that ran the last call (`plan`, `algorithms._lead`): recorded in its event.
        self.algorithm: str | None = None
        self._plans: dict[tuple[str, int, bool], tuple[Algorithm, ...]] = {}

    def plan(self, collective: str, nbytes: int, ufunc: bool) -> tuple[Algorithm, ...]:
        """The selector's units for this call, cheapest first (`selector.plan`), decided once per
        job and call site (what it depends on does not change within a job). `algorithm` becomes
        the first's name (the leader renames it if that unit declines)."""
        key = (collective, nbytes, ufunc)
        units = self._plans.get(key)
        if units is None:
            layout = self.topo.layout
            p = len(layout.leaders)
            units = self._plans[key] = plan(collective, Situation(p, nbytes, p > 1 and self.leaders_share_board(),
                                                                  ufunc, len(layout.nodes)))
        self.algorithm = units[0].name
        return units

    def send(self, dst: int, round_: int, payload: Any) -> None:
        self.fabric.send(dst, keys.collective(self.seq, round_), (self.fingerprint.wire, payload))

    def send_stream(self, targets: Sequence[int], rounds: Sequence[int], pieces: Sequence[Any]) -> Callable[[], None]:
        """Send `pieces[k]` under `rounds[k]` to every one of `targets`, piece by piece, from a worker
        thread, so this replica meanwhile receives and reduces what its peers stream to it; the
        returned `finish()` waits until every piece was handed to the transport and raises what a
        send raised (an abort of the replica ends the wait). A single piece is sent here and now."""
        if len(pieces) == 1:
            for t in targets:
                self.send(t, rounds[0], pieces[0])
            return _nothing
        fabric, wire, seq = self.fabric, self.fingerprint.wire, self.seq
        mailbox = fabric.mailbox
        for _ in range(len(targets) * len(pieces)):  # counted here: only the replica's thread counts
            mailbox.count_sent()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                for round_, piece in zip(rounds, pieces):
                    key = keys.collective(seq, round_)
                    for t in targets:
                        fabric.send_counted(t, key, (wire, piece))
            except BaseException as e:  # noqa: BLE001 - raised by `finish`, in the replica's thread
                failed.append(e)

        task = workers.submit(run, f"replica {self.me}: stream")

        def finish() -> None:
            mailbox.wait_external(None, task.is_set, task.wait, _nothing)
            if failed:
                raise failed[0]

        return finish

    def recv(self, sources: Sequence[int], round_: int) -> list[Any]:
        """The payloads `sources` sent in `round_`, in that order, each fingerprint checked first."""
        if not sources:
            return []
        key = keys.collective(self.seq, round_)
        if len(sources) == 1:  # the usual case (a result, a leader's peer): no lists to zip
            return [self.recv_one(sources[0], round_)]
        values = self.fabric.recv_all([(s, key) for s in sources], self.block)
        own = self.fingerprint.wire
        payloads = []
        for src, (theirs, payload) in zip(sources, values):
            if theirs is not own:  # in-process members send the very same (interned) tuple
                self._check(src, theirs)
            payloads.append(payload)
        return payloads

    def recv_one(self, src: int, round_: int) -> Any:
        """The payload `src` sent in `round_`, its fingerprint checked first."""
        return self._received(src, keys.collective(self.seq, round_))[1]

    def _received(self, src: int, key: Hashable) -> tuple[tuple, Any]:
        """The message (fingerprint, payload) `src` sent under `key`, the fingerprint checked."""
        message = self.fabric.recv(src, key, self.block)
        if message[0] is not self.fingerprint.wire:
            self._check(src, message[0])
        return message

    def _check(self, src: int, theirs: tuple) -> None:
        own = self.fingerprint.wire
        if theirs is not own and theirs != own:
            differences = diff(own, theirs, strict=self.fabric.strict)
            if differences:
                raise mismatch_error(self.seq, self.me, self.fingerprint, src, theirs, differences)

    # -- the leaders' level -------------------------------------------------------------------------
    def among_leaders(self, round_: int, payload: Any, per_destination: bool = False) -> list[Any]:
        """One round among the group's process leaders: each sends `payload` (or, `per_destination`,
        `payload[q]` to the leader of process q) to every other; what each sent here, by process
        position (this leader's own at its position). Through the same-node board when every
        leader shares this node (see `transport/board.py`), else as fabric messages."""
        topo = self.topo
        leaders, pos, others = topo.layout.leaders, topo.position, topo.other_positions
        out: list[Any] = [None] * len(leaders)
        out[pos] = payload[pos] if per_destination else payload
        if self.leaders_share_board():
            self.publish_on_board(payload, round_, per_destination)
            for q in others:
                out[q] = self.read_board(q, round_, per_destination)
            return out
        for q in others:
            self.send(leaders[q], round_, payload[q] if per_destination else payload)
        for q, value in zip(others, self.recv([leaders[q] for q in others], round_)):
            out[q] = value
        return out

    def leaders_share_board(self) -> bool:
        """Whether the leaders' rounds go through the same-node board: every leader is an actor of
        this node, and they are at most `Thresholds.board_readers`."""
        shared = self.fabric.shared
        leaders = self.topo.layout.leaders
        if shared is None or shared.board is None or len(leaders) > THRESHOLDS.board_readers:
            return False
        same_node = shared.same_node
        for q in self.topo.other_positions:
            if leaders[q] not in same_node:
                return False
        return True

    def publish_on_board(self, payload: Any, round_: int = LEADER_ROUND, per_destination: bool = False) -> None:
        """Publish `payload` to the other leaders in `round_` on the board (where `leaders_share_board`);
        one too large for a slot is announced there and sent as messages (`payload[q]` to the leader
        of process q, `per_destination`)."""
        topo = self.topo
        shared = self.fabric.shared
        board, leaders, others = shared.board, topo.layout.leaders, topo.other_positions
        writer = topo.leader  # as the process's first member, whoever leads (its slot is where the peers read)
        if board.publish(writer, shared_board.tag_of(self.seq, round_),
                         board.fingerprint_bytes(self.fingerprint.wire), payload, others, self._wait_released):
            for q in others:  # what went through shared memory, by destination (for tests)
                shared.count(writer, leaders[q])
            return
        if writer != self.me:  # `kernels.Collective` lets a member act only where payloads fit
            raise RuntimeError(f"replica {self.me}: a payload acting for replica {writer} did not fit the board")
        for q in others:
            self.send(leaders[q], round_, payload[q] if per_destination else payload)

    def read_board(self, q: int, round_: int = LEADER_ROUND, per_destination: bool = False) -> Any:
        """What the leader of process `q` published in `round_` (`publish_on_board`; its part for this
        process, `per_destination`), its fingerprint checked first: views of the board until `release`."""
        board, leader, pos = self.fabric.shared.board, self.topo.layout.leaders[q], self.topo.position
        value = self._read(board, leader, round_, shared_board.tag_of(self.seq, round_), pos,
                           board.fingerprint_bytes(self.fingerprint.wire))
        if value is _VIA_FABRIC:
            return self.recv([leader], round_)[0]
        return value[pos] if per_destination else value

    def board_round(self, first: tuple[np.ndarray, ...] | None, fill: Callable[[tuple[np.ndarray, ...]], Any],
                    layout: tuple[tuple[np.dtype, tuple[int, ...]], ...] | None = None,
                    meanwhile: Callable[[], Any] | None = None) -> list[Any] | None:
        """One round among the leaders on the same-node board in which this process's payload is a
        tuple of arrays laid out as `first` (C-contiguous) or as `layout` ((dtype, shape) each),
        written by `fill(views)` straight into its board buffer (an all-reduce's partial is summed
        there: no partial of its own, no copy into the slot; an all-gather's operands, an
        all-to-all's chunks are copied there and nowhere else). `meanwhile()`, if given, runs once
        the buffer is published and before the peers' are read (this process's own part of the
        result, while the peers write theirs). What each leader published, by process position (this
        one's own views at its position; views of the board until `release`). None, with nothing
        done, when the round does not go on the board or the arrays do not fit a buffer."""
        topo = self.topo
        leaders, pos, others = topo.layout.leaders, topo.position, topo.other_positions
        if not self.leaders_share_board():
            return None
        shared = self.fabric.shared
        board = shared.board
        if layout is None:
            assert first is not None
            for a in first:
                if not a.flags.c_contiguous:
                    return None
            layout = tuple((a.dtype, a.shape) for a in first)
        tag = shared_board.tag_of(self.seq, LEADER_ROUND)
        fingerprint = board.fingerprint_bytes(self.fingerprint.wire)
        writer = topo.leader  # its slot, whoever acts (see `publish_on_board`)
        views = board.publish_into(writer, tag, fingerprint, layout, others, self._wait_released)
        if views is None:
            return None
        fill(views)
        board.commit(writer, tag)
        for q in others:
            shared.count(writer, leaders[q])
        if meanwhile is not None:
            meanwhile()
        out: list[Any] = [None] * len(leaders)
        out[pos] = views
        for q in others:
            value = self._read(board, leaders[q], LEADER_ROUND, tag, pos, fingerprint)
            out[q] = self.recv([leaders[q]], LEADER_ROUND)[0] if value is _VIA_FABRIC else value
        return out

    def _read(self, board: shared_board.Board, writer: int, round_: int, tag: int, position: int,
              fingerprint: bytes) -> Any:
        """What `writer` published under `tag` (views), fingerprint checked first; `_VIA_FABRIC` when
        it announced that the payload follows as a message."""
        theirs, value, via_fabric, read = board.open(self._wait_published(board, writer, tag), tag, position)
        if theirs != fingerprint:
            self._check(writer, pickle.loads(theirs))  # noqa: S301 - this job's actors only
        self._reads.append(read)  # an announcement too: its writer reuses the buffer once it was seen
        return _VIA_FABRIC if via_fabric else value

    # -- point to point (collective-permute) ---------------------------------------------------------
    def _board_for(self, peer: int) -> shared_board.Board | None:
        """The board, if `peer` is a replica of another actor on this node (in-process peers get
        messages by reference)."""
        fabric = self.fabric
        shared = fabric.shared
        if shared is None:
            return None
        board = shared.board
        if board is not None and peer in shared.same_node and fabric.placement[peer] != fabric.placement[self.me]:
            return board
        return None

    def send_pairwise(self, targets: Sequence[int], value: Any) -> None:
        """Send `value` to each target (a replica is the source of at most one pair): through the
        board to another actor of this node (reader position 0), as a message otherwise.

        Arrays (a lone one as a tuple of one, C-contiguous) are written raw into the board buffer
        whatever their size up to a slot: one wait for the reader (the board word), where the arena
        and a socket message made it wait twice (the board's announcement, then the message through
        the peer's reader thread and mailbox). Larger
        ones, and large values of other kinds, are only announced on the board (so the reader
        compares fingerprints there first) and go as a message through the shared-memory arena."""
        for t in targets:
            board = self._board_for(t)
            if board is None:
                self.send(t, 0, value)
                continue
            fingerprint = board.fingerprint_bytes(self.fingerprint.wire)
            tag = shared_board.tag_of(self.seq, 0)
            arrays = (value,) if type(value) is np.ndarray else value
            if type(arrays) is tuple and _raw(arrays):
                # `publish` announces what does not fit a slot: the bytes then follow as a message.
                if board.publish(self.me, tag, fingerprint, arrays, (0,), self._wait_released):
                    self.fabric.shared.count(self.me, t)
                else:
                    self.send(t, 0, value)
                continue
            if payload_bytes(value) >= shm.MIN_BYTES:
                # Announced first, then sent: the reader compares fingerprints on the board while the
                # bytes travel (sending first made the reader wait for both in turn).
                board.publish(self.me, tag, fingerprint, value, (0,), self._wait_released, announce_only=True)
                self.send(t, 0, value)
            elif board.publish(self.me, tag, fingerprint, value, (0,), self._wait_released):
                self.fabric.shared.count(self.me, t)
            else:
                self.send(t, 0, value)

    def recv_pairwise(self, source: int, lone: bool = False) -> Any:
        """What `source` sent by `send_pairwise` (a view of its board buffer until `settle` when it is
        not a tuple of arrays); `lone`: the value is one array (this replica's own operand is, and the
        fingerprints say the shapes agree), which the board brings as a tuple of one.

        Arrays read off the board are copied at once into buffers of the replica's pool (no fresh
        pages per call: a fresh result costs page faults on every call) and
        the board buffer is released to its writer before this returns."""
        board = self._board_for(source)
        if board is not None:
            value = self._read(board, source, 0, shared_board.tag_of(self.seq, 0), 0,
                               board.fingerprint_bytes(self.fingerprint.wire))
            if value is not _VIA_FABRIC:
                if type(value) is tuple and _raw(value):
                    pool = pool_of(self.fabric)
                    copies = tuple(pool.empty(view.shape, view.dtype) for view in value)
                    copy_all(copies, value)
                    self.release()
                    value = copies
                # A lone array comes as a tuple of one (`send_pairwise`); a tuple operand as itself.
                return value[0] if lone and type(value) is tuple else value
        return self.recv([source], 0)[0]

    def _wait_published(self, board: shared_board.Board, writer: int, tag: int) -> Any:
        found = board.find(writer, tag)
        if found is not None:
            return found
        mapping, word = board.counter(writer)
        address = mapping.address + 4 * word
        words = mapping.words

        def ready() -> bool:
            return board.find(writer, tag) is not None

        spinner = self.fabric.shared.spinner  # a board wait: the link is there
        if spinner is not None and spinner.watch(mapping, word, ready):
            found = board.find(writer, tag)
            if found is not None:
                return found

        def sleep(timeout: float) -> None:
            seen = int(words[word])
            if not ready():
                futex.wait(address, seen, timeout)

        self.fabric.mailbox.wait_external(self.block, ready, sleep, lambda: futex.wake(address))
        return board.find(writer, tag)

    def _wait_released(self, done: Callable[[], bool], address: int) -> None:
        """A writer waiting for the readers of its buffer's previous round: they have all they need
        to finish that round, so it is running, not blocked."""
        word = futex.u32_at(address)

        def sleep(timeout: float) -> None:
            seen = word.value
            if not done():
                futex.wait(address, seen, timeout)

        self.fabric.mailbox.wait_external(None, done, sleep, lambda: futex.wake(address),
                                          shared_board.RELEASE_SLICE)

    def settle(self, value: Any) -> Any:
        """`value` with every array that is a view of a peer's board buffer copied out, then the
        buffers released to their writers (the collective is done with them)."""
        if not self._reads:
            return value
        value = _copied_out(value, self._reads)
        self.release()
        return value

    def release(self) -> None:
        if not self._reads:  # the usual case: nothing was read off the board
            return
        reads, self._reads = self._reads, []
        for read in reads:
            read.release()

    # -- the in-process level ---------------------------------------------------------------------
    def gather_local(self, payload: Any) -> list[Any] | None:
        """On the member that leads: every local member's payload, in group order. Elsewhere: hand
        `payload` to the leader and return None (the member then waits in `result`)."""
        topo = self.topo
        meeting = self.meeting
        if meeting is not None:
            got = meeting.meet(self.seq, topo.rank, len(topo.local), self.fingerprint.wire, self.me, payload,
                               self.fabric.mailbox, self._check)
            if got is None:
                return None
            parts, self._boxes = got
            return parts
        if not topo.is_leader:
            self.send(topo.leader, DEPOSIT, payload)
            return None
        others = topo.local_others
        if not others:
            return [payload]
        return [payload, *self.recv(others, DEPOSIT)]

    def scatter_local(self, results: Sequence[Any] | None, shared: Any = None, settled: bool = False) -> Any:
        """On the leader: start handing each other local member its result (`results[k]` for local
        member k, or `shared` for all) and return the leader's own. `settled`: no result is a view of
        the board (whatever this replica still reads there, it releases itself later).

        The results travel down `RESULT_LANES` chains of the local members (member k forwards to
        member k + RESULT_LANES before it goes on with its own work): a few threads at a time become
        runnable, instead of every member waking at once and queueing for the GIL (whose waiters each
        poll every switch interval: a cost that grows with the square of the threads waiting); and
        the last member waits for N / RESULT_LANES wake-ups in a row, not N (each a wait for a core
        on a loaded machine, where one chain of 1024 members took tens of seconds)."""
        topo = self.topo
        if self._reads and not settled:
            results, shared = self.settle((results, shared))
            if len(topo.local) > 1:  # one copy shared by several members: nobody may change it
                for v in shared if isinstance(shared, tuple) else (shared,):
                    if isinstance(v, np.ndarray):
                        v.setflags(write=False)
        boxes = self._boxes
        if boxes is not None:
            # Acting for the process: the first RESULT_LANES of the other members, in rank order, get
            # the results from here, each the next of its lane (see `result`). All under the first
            # member's name, whoever acts: a waiting member knows whom it waits for.
            rank, waiting = topo.rank, len(boxes) - 1
            message = (self.fingerprint.wire, (results, shared, rank, boxes))
            key = keys.collective(self.seq, RESULT)
            leader = topo.leader
            count = self.fabric.mailbox.count_sent  # before each delivery, as `Fabric.send`
            for j in range(min(RESULT_LANES, waiting)):
                count()
                boxes[j if j < rank else j + 1].deliver(leader, key, message)
            return shared if results is None else results[rank]
        to = topo.result_to
        if to:
            message = (self.fingerprint.wire, (results, shared))
            key = keys.collective(self.seq, RESULT)
            send = self.fabric.send
            for dst in to:
                send(dst, key, message)
        return shared if results is None else results[0]

    def result(self) -> Any:
        """On a member that did not lead: its result, from the previous member of its chain (passed on
        first)."""
        topo = self.topo
        if self.meeting is not None:
            # The members but the acting one, in rank order, form RESULT_LANES lanes: the k-th of
            # them hands the results on to the (k + RESULT_LANES)-th: the very message it took, under
            # the same key. (`_received` and the fabric's `recv`, which takes a collective key from the
            # mailbox under every transport, inlined: two frames fewer per member and collective.)
            leader, key = topo.leader, (keys.COLLECTIVE, self.seq, RESULT)
            message = self.fabric.mailbox.take(leader, key, self.block)
            if message[0] is not self.fingerprint.wire:
                self._check(leader, message[0])
            results, shared, acting, boxes = message[1]
            rank = topo.rank
            following = (rank if rank < acting else rank - 1) + RESULT_LANES
            if following < len(boxes) - 1:
                self.fabric.mailbox.count_sent()
                boxes[following if following < acting else following + 1].deliver(leader, key, message)
            return shared if results is None else results[rank]
        payload = self.recv_one(topo.result_from, RESULT)
        for dst in topo.result_to:
            self.send(dst, RESULT, payload)
        results, shared = payload
        return shared if results is None else results[topo.rank]


def _nothing(*_: Any) -> None:
    pass


def _raw(arrays: tuple) -> bool:
    """Whether `arrays` are all C-contiguous arrays of plain (non-object) dtypes: what the board
    takes raw (`Board.publish`)."""
    for a in arrays:
        if type(a) is not np.ndarray or not a.flags.c_contiguous or a.dtype.hasobject:
            return False
    return True


def _copied_out(value: Any, reads: list[shared_board.Read]) -> Any:
    """`value` with the arrays that share memory with `reads` copied. (A module function: a nested
    recursive one is a reference cycle that kept the board's buffers mapped until a collection.)"""
    if isinstance(value, np.ndarray) and any(np.may_share_memory(value, r.region) for r in reads):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(_copied_out(x, reads) for x in value)
    if isinstance(value, list):
        return [_copied_out(x, reads) for x in value]
    return value
