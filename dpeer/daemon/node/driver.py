"""One node's runtime driver: feeds the membership and consensus cores, persists, sends.

Everything runs on one asyncio loop, so the cores are only ever touched from one thread.
The driver owns the clock and the I/O the pure cores leave to their caller: it persists each
Raft Ready to the store before releasing its messages, turns core messages into Envelopes,
and reports applied entries to whoever waits for them (RPCs, the worker supervisor).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
from dataclasses import replace
from typing import Any, Callable

from dpeer.clock import REAL, Clock
from dpeer.transport import codec
from dpeer.consensus import NotLeader, Peer, Proposed, RaftNode, ReadRequested, Refused, Role
from dpeer.consensus.ready import Outgoing, ProposeResult, Ready, drive, persist
from dpeer.consensus.messages import AppendRequest, RaftHeartbeat, SnapshotRequest
from dpeer.consensus.voting import ChangeOp
from dpeer.errors import BadRequest, Unavailable
from dpeer.ids import SECRETS, Ids
from dpeer.membership import (
    Ack,
    HeartbeatObserved,
    MemberAlive,
    MemberDead,
    MemberLeft,
    MemberRecord,
    MemberState,
    MemberSuspect,
    Membership,
    Ping,
)
from dpeer.daemon.node.events import NodeEvents, NoEvents
from dpeer.daemon.decide.probe_rtt import ProbeTimes
from dpeer.daemon.decide.resync_plan import LocalVersion
from dpeer.daemon.decide.sightings import Sightings, Windows, copy_of, held_twice
from dpeer.daemon.node.storage_adapter import StoreStorage
from dpeer.daemon.timing import Timing, resolve
from dpeer.daemon.decide.proposals import Observed
from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.errors import CommittedEntryError, CorruptState
from dpeer.statemachine.payloads import Payload, decode
from dpeer.statemachine.snapshot import decode_snapshot
from dpeer.statemachine.state import ApplyResult, MemberStatus
from dpeer.statemachine.store import Store

log = logging.getLogger("dpeer.node")
Sender = Callable[[str, pb.Envelope], None]
# How often chores run: the leader's decide views and membership (latency matters); the others'
# only watch their worker and their own membership record. Once nothing has changed for
# CHORES_BUSY_FOR seconds (no membership change, applied entry or role change; see poke()) and the
# events are not busy, chores run every IDLE_CHORES instead.
LEADER_CHORES, FOLLOWER_CHORES, IDLE_CHORES = 0.02, 0.1, 1.0
# Applied entries that give the chores nothing to react to (a training box commits a checkpoint
# every few hundred steps; waking the chores for each kept a daemon busy beside its worker).
_QUIET_KINDS = frozenset({EntryKind.CHECKPOINT, EntryKind.KV_PUT, EntryKind.NOOP})
CHORES_BUSY_FOR = 1.0
# An input that moves the next deadline later by more than this re-arms the sleeping loop's
# alarm instead of letting it fire for nothing; smaller moves are not worth a new timer.
REARM_SLACK = 0.005
_LEADER_MSGS = (AppendRequest, RaftHeartbeat, SnapshotRequest)


# asyncio runs a timer due within its clock resolution at once, without its clock moving; a
# deadline a hair away (a float's rounding) would then wake the loop for ever at the same time
TIMER_FLOOR = 1e-6


class Node:
    """The cores of one node wired to its store and network; see the module docstring."""

    def __init__(
        self, node_id: str, addr: str, store: Store, sender: Sender, *, preset: str = "lan",
        max_voters: int = 5, clock: Clock = REAL, seed: int | None = None, timing: Timing | None = None,
        snapshot_every: int = 10_000, snapshot_keep: int = 1_000, events: NodeEvents | None = None,
        ids: Ids = SECRETS,
    ) -> None:
        self.events: NodeEvents = events or NoEvents()
        self.id, self.addr, self.store, self.ids = node_id, addr, store, ids  # ids: every random id it draws
        self.clock, self.wall = clock.now, clock.wall
        self.storage = StoreStorage(store)
        self._send = sender
        rng = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "big"))
        now = clock.now()
        timing = timing or resolve(preset, {}, max_voters)  # the config's timing overrides, else the preset's
        self.raft_config = replace(timing.raft, max_voters=max_voters)
        self.raft = RaftNode(node_id, self.storage, self.raft_config, rng, now)
        known = [MemberRecord(n, m.addr, MemberState.ALIVE, 0) for n, m in store.state.members.items()
                 if n != node_id and m.status is MemberStatus.ACTIVE]
        self.swim = Membership(node_id, addr, timing.membership, rng, now, known=known)
        self.addrs: dict[str, str] = {n: m.addr for n, m in store.state.members.items()}
        self.addrs[node_id] = addr
        self.since: dict[str, tuple[MemberState, float]] = {}
        # this daemon's start, told in every Envelope: two processes under one id and store tell apart by it
        self.boot, self.started, self.windows = ids.token_hex(8), now, Windows.of(self.raft_config)
        self.sightings = Sightings(node_id, now, store.uid, self.boot, addr)  # who answers for each node id
        self._copies_told: set[tuple[str, str, str]] = set()  # (node id, older boot, newer boot) warned of
        self.probes = ProbeTimes()
        self.snapshot_every, self.snapshot_keep = snapshot_every, snapshot_keep
        self.role: Role = Role.FOLLOWER
        self.leader_id: str | None = None
        self._last_leader: str | None = None  # the newest leader this node has known (kept while none is)
        self.stopping = False
        self.invalid_messages = 0
        self.forced = self.force_refused = 0
        self.admitted_by: str | None = None
        self.entries_written = 0
        self._waiters: dict[int, list[tuple[int, asyncio.Future]]] = {}
        self._reads: dict[int, asyncio.Future] = {}
        self._applied_waiters: list[tuple[int, asyncio.Future]] = []
        self._waiter: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._sleep_until = math.inf
        self._next_chores = now
        self._busy_until = now + CHORES_BUSY_FOR

    # -- inputs ---------------------------------------------------------------------------
    def deliver(self, envelope: pb.Envelope) -> None:
        """Take one Envelope from a peer; BadRequest when it is malformed or forged."""
        msg = codec.decode(envelope)
        peer = codec.sender(envelope)
        boot, up = codec.boot_of(envelope)
        now = self.clock()
        self.sightings.saw(peer.node_id, peer.uid, envelope.from_addr, now, boot, up if boot else None)
        self._refuse_copy(peer, boot, now)
        self.raft.observe(peer)
        if isinstance(msg, codec.MEMBERSHIP_TYPES):
            if msg.hb.node_id != envelope.from_id and not isinstance(msg, Ack):
                raise BadRequest(f"heartbeat of {msg.hb.node_id!r} sent by {envelope.from_id!r}")
            self.addrs.setdefault(msg.hb.node_id, msg.hb.addr)
            if isinstance(msg, Ack) and msg.hb.node_id == envelope.from_id:
                self.probes.acked(envelope.from_id, msg.seq, now)
            self._send_swim(self.swim.receive(now, msg))
            self._swim_effects(now)
        else:
            self._admit_raft(peer, msg)
            self.addrs.setdefault(envelope.from_id, envelope.from_addr)
            self.raft.step(now, peer, msg, envelope.to_uid)
            try:
                self.drain()
            except CommittedEntryError as exc:
                log.error("the leader %s would overwrite committed entries here (%s): this node's log "
                          "diverged, as after a forced reconfiguration; move its data dir aside and "
                          "rejoin", envelope.from_id, exc)
                raise BadRequest(f"log diverges from {envelope.from_id!r} on committed entries") from None
        self._wake_if_sooner()

    def _admit_raft(self, peer: Peer, msg: Any) -> None:
        """Raft messages come only from nodes the configuration in force here names (the core
        drops those under another store uid, a lost disk, and refuses, once loudly, those of an
        older cluster epoch); on a member, also from a leader of its term or a newer one (elected
        in a configuration this node has not learned yet: it missed the entry that added the
        leader, and only that leader's entries bring it); on a node that has not yet learned a
        configuration that includes it, from the leader that admitted it alone; and a snapshot
        must decode first."""
        src, conf = peer.node_id, self.raft.membership
        member = conf.is_member(self.id, self.raft.uid)
        leading = isinstance(msg, _LEADER_MSGS) and (
            msg.term >= self.raft.term if member else src == self.admitted_by)
        old_epoch = 0 < peer.epoch < conf.epoch
        if src not in conf.members and not leading and not old_epoch:
            raise BadRequest(f"Raft message from {src!r}, which is not a member of this cluster")
        if isinstance(msg, SnapshotRequest):
            try:
                decode_snapshot(msg.index, msg.term_of_index, msg.data)
            except CorruptState as exc:
                raise BadRequest(f"snapshot from {src!r} does not decode: {exc}") from None

    def _refuse_copy(self, peer: Peer, boot: str, now: float) -> None:
        """BadRequest (and, once, a warning) for a message of a process under a node id and store
        that another live process, started before it, holds: a copy of its disk never votes here."""
        window = self.windows.of_member(peer.node_id in self.store.state.voters)
        copy = copy_of(self.sightings, peer.node_id, peer.uid, boot, window, now) if boot else None
        if copy is None:
            return
        if (key := (copy.node_id, copy.older[0], boot)) not in self._copies_told:
            self._copies_told = {key} if len(self._copies_told) >= 64 else self._copies_told | {key}
            log.warning("%s; its messages are refused until it stops", copy.describe(now))
        raise BadRequest(copy.sentence())

    def answering_voters(self, now: float) -> set[str] | None:
        """On the leader: the voters that answer under their configured store (RaftNode's count)
        and are not held twice (two processes answering as one voter is no safe seat); else None."""
        answering, state = self.raft.answering_voters(now), self.store.state
        twice = held_twice(self.sightings, state.voters, state.uids, self.windows.voter, now)
        return None if answering is None else answering - set(twice)

    def refused(self, addr: str) -> None:
        """A connection to addr was refused: strong evidence its process is gone."""
        now = self.clock()
        self._send_swim(self.swim.unreachable(now, addr))
        self._swim_effects(now)
        self._wake_if_sooner()

    def join_seeds(self, seeds: list[str]) -> None:
        """Start gossip through the seed addresses (push-pull with each)."""
        self._send_swim(self.swim.join(self.clock(), seeds))
        self._wake_if_sooner()

    # -- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Run timers until stop(): Raft ticks, SWIM probes, resyncs and leader chores.

        The loop sleeps until the earliest deadline; an input wakes it only when it brought a
        deadline forward (most messages do not), so an idle node wakes a few times per second.
        """
        loop = asyncio.get_running_loop()
        while not self.stopping:
            now = self.clock()
            due = self._due()
            if due > now:
                self._waiter = waiter = loop.create_future()
                self._arm(due, now)
                await waiter
                self._timer.cancel()
                self._waiter, self._sleep_until = None, math.inf
            self.step_timers()

    def _arm(self, due: float, now: float) -> None:
        """Set the sleeping loop's alarm for `due` (at most a second away)."""
        self._sleep_until = due
        delay = min(max(due - now, TIMER_FLOOR), 1.0)
        self._timer = asyncio.get_running_loop().call_later(delay, _resolve, self._waiter)

    def _due(self) -> float:
        swim_due = self.swim.next_tick()
        return min(self.raft.next_deadline(), math.inf if swim_due is None else swim_due, self._next_chores)

    def _wake(self) -> None:
        if self._waiter is not None:
            _resolve(self._waiter)

    def _wake_if_sooner(self) -> None:
        """After an input: wake the loop if its next deadline came forward; move the alarm
        out if the deadline went later (an ack answered a probe), so the loop sleeps through."""
        if self._waiter is None:
            return
        due = self._due()
        if due < self._sleep_until:
            _resolve(self._waiter)
        elif due > self._sleep_until + REARM_SLACK and self._timer is not None:
            self._timer.cancel()
            self._arm(due, self.clock())

    def poke(self) -> None:
        """Something chores may act on changed: keep them on their short period for a while."""
        now = self.clock()
        self._busy_until = now + CHORES_BUSY_FOR
        self._next_chores = min(self._next_chores, now + self._chore_period(now))
        self._wake_if_sooner()

    def chores_now(self) -> None:
        """Run the chores at the next loop turn, once (the worker rang: a report to act on)."""
        self.chores_at(self.clock())

    def chores_at(self, when: float) -> None:
        """Run the chores at `when` at the latest (a quiet window ends then), once."""
        self._next_chores = min(self._next_chores, when)
        self._wake_if_sooner()

    def _chore_period(self, now: float) -> float:
        if now < self._busy_until or self.events.busy():
            return LEADER_CHORES if self.role is Role.LEADER else FOLLOWER_CHORES
        return IDLE_CHORES

    def step_timers(self) -> None:
        """Run whatever timers are due now."""
        now = self.clock()
        if now >= self.raft.next_deadline():
            self.raft.tick(now)
        swim_due = self.swim.next_tick()
        if swim_due is not None and now >= swim_due:
            self._send_swim(self.swim.tick(now))
        self._swim_effects(now)
        self.drain()
        if now >= self._next_chores:
            self._next_chores = math.inf  # a chores_at()/chores_now() during the pass is kept
            try:
                self.events.chores(now)
            finally:
                self._next_chores = min(self._next_chores, now + self._chore_period(now))

    def stop(self) -> None:
        """Make run() return at its next wake-up."""
        self.stopping = True
        self._wake()

    # -- Raft Ready -------------------------------------------------------------------------
    def drain(self) -> None:
        """Handle every pending Ready in the documented order (consensus.ready.drive): persist,
        apply, send. Hard state, new entries and the commit index go to disk in one synced
        transaction; the messages (votes, acknowledgements) leave only after that."""
        drive(self.raft, _NodeReady(self))
        if self.store.maybe_snapshot(self.snapshot_every, self.snapshot_keep):
            log.info("snapshot at index %d; log compacted", self.store.snapshot_index)
        self.swim.set_local_version(self.store.current_term, self.store.last_applied, self.store.commit_index)
        self._wake_if_sooner()

    def _on_soft(self, leader: str | None, name: str) -> None:
        role = Role(name)
        if (leader, role) != (self.leader_id, self.role):
            log.info("role %s, leader %s", role.value, leader)
            self.leader_id, self.role = leader, role
            self.poke()
            if leader is not None and leader != self._last_leader:
                self._last_leader = leader  # a lost pre-vote restores the old one: not news
                self.chores_now()  # a failure report owed to the new leader: now, not a chore period later
        if role is not Role.LEADER:
            for fut in list(self._reads.values()):
                if not fut.done():
                    fut.set_exception(Unavailable("leadership changed during the read; try again"))
            self._reads.clear()

    def _applied(self, done: list[tuple[Entry, ApplyResult]]) -> None:
        if any(entry.kind not in _QUIET_KINDS for entry, _ in done):
            self.poke()
        for entry, result in done:
            if entry.kind is EntryKind.MEMBER_JOINED and result.accepted:  # a refused entry may be malformed
                joined = decode(entry.kind, entry.payload)
                self.addrs[joined.node_id] = joined.addr  # type: ignore[union-attr]
            for term, fut in self._waiters.pop(entry.index, []):
                if not fut.done():
                    fut.set_result((entry.term == term, entry, result))
            self.events.applied(entry, result)
        applied = self.store.last_applied
        keep = []
        for index, fut in self._applied_waiters:
            if index <= applied:
                if not fut.done():
                    fut.set_result(applied)
            else:
                keep.append((index, fut))
        self._applied_waiters = keep

    # -- commands ---------------------------------------------------------------------------
    async def propose(self, payload: Payload, timeout: float) -> tuple[Entry, ApplyResult]:
        """Propose an entry as leader and wait until it is applied; Unavailable if it is not."""
        result = self.raft.propose(payload.KIND, payload.to_payload())
        return await self._wait_proposal(result, timeout)

    def removal_refusal(self, node: str) -> str | None:
        """Why removing voter `node` now would leave no live quorum (None: it would not)."""
        refused = self.raft.removal_refusal(node)
        return refused.reason if refused is not None else None

    async def change_membership(self, op: ChangeOp, node: str, uid: str, timeout: float) -> tuple[Entry, ApplyResult]:
        """Propose one single-server configuration change (uid: the store uid of a node being
        added) and wait until it is applied."""
        return await self._wait_proposal(self.raft.change_membership(op, node, uid), timeout)

    async def _wait_proposal(self, result: Any, timeout: float) -> tuple[Entry, ApplyResult]:
        if isinstance(result, NotLeader):
            raise Unavailable(f"not the leader (leader: {result.leader or 'unknown'})")
        if isinstance(result, Refused):
            raise BadRequest(f"refused: {result.reason}")
        assert isinstance(result, Proposed)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(result.index, []).append((result.term, fut))
        self.drain()
        self._wake_if_sooner()
        try:
            same_term, entry, applied = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise Unavailable(f"entry {result.index} was not committed within {timeout:g}s (no quorum?)") from None
        if not same_term:
            raise Unavailable(f"leadership changed before entry {result.index} committed; try again")
        return entry, applied

    async def read_barrier(self, timeout: float) -> int:
        """ReadIndex: wait until a quorum confirmed leadership and the read index is applied."""
        result = self.raft.read_index()
        if isinstance(result, NotLeader):
            raise Unavailable(f"not the leader (leader: {result.leader or 'unknown'})")
        assert isinstance(result, ReadRequested)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._reads[result.request_id] = fut
        self.drain()
        self._wake_if_sooner()
        try:
            index = await asyncio.wait_for(fut, timeout)
            await self.wait_applied(index, timeout)
        except asyncio.TimeoutError:
            self._reads.pop(result.request_id, None)
            raise Unavailable(f"leadership not confirmed by a quorum within {timeout:g}s") from None
        return index

    async def wait_applied(self, index: int, timeout: float) -> int:
        """Wait until last_applied >= index."""
        if self.store.last_applied >= index:
            return self.store.last_applied
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._applied_waiters.append((index, fut))
        return await asyncio.wait_for(fut, timeout)

    def accept_committed(self, entries: list[Entry], commit_index: int, sender: Peer, sender_term: int) -> bool:
        """Take committed entries fetched from a peer (resync); False when they do not fit or
        the peer may not supply them (see RaftNode.accept_committed)."""
        result = self.raft.accept_committed(entries, commit_index, sender, sender_term)
        if not result.accepted:
            log.info("resync batch from %s refused: %s", sender.node_id, result.reason)
        self.drain()
        return result.accepted

    def force(self, voters: list[str]) -> ProposeResult:
        """UNSAFE operator recovery: make `voters` the whole voting configuration in a new
        cluster epoch and campaign, unless the core refuses (see consensus/force.py)."""
        log.warning("FORCED reconfiguration requested by an operator: voters %s", voters)
        result = self.raft.force_new_configuration(self.clock(), voters, self.alive_voters(), self.wall())
        if isinstance(result, Refused):
            self.force_refused += 1
        else:
            self.forced += 1
        self.drain()
        return result

    def alive_voters(self) -> set[str]:
        """Voters gossip holds alive (or only suspects) and last heard under the store uid the
        configuration names: the failure detector's half of force's reachability check."""
        conf, seen = self.raft.membership, self.raft.seen_uids
        up = (MemberState.ALIVE, MemberState.SUSPECT)
        return {v for v in conf.voters if self.swim.state_of(v) in up and seen.get(v) == conf.uid_of(v)}

    # -- views of the cores ---------------------------------------------------------------
    @property
    def local_version(self) -> LocalVersion:
        """Our log position, as resync planning sees it."""
        return LocalVersion(self.store.current_term, self.store.last_applied, self.store.commit_index)

    def observed(self) -> dict[str, Observed]:
        """Gossip's view of every member with how long it has been in its state."""
        out = {}
        for rec in self.swim.members():
            state, since = self.since.get(rec.node_id, (rec.state, 0.0))
            out[rec.node_id] = Observed(rec.state, rec.addr, since if state is rec.state else 0.0)
        return out

    # -- output ---------------------------------------------------------------------------
    def _send_swim(self, out: list[tuple[str, Any]]) -> None:
        for addr, msg in out:
            if isinstance(msg, Ping):
                self.probes.sent(msg.target, msg.seq, self.clock())
            self._send(addr, self.envelope(msg))

    def envelope(self, msg: Any, to_uid: str = "") -> pb.Envelope:
        """A core message in an Envelope from this node (its identity, address and boot)."""
        return codec.encode(msg, self.raft.identity, self.addr, to_uid, self.boot, self.clock() - self.started)

    def _send_raft(self, dst: str, uid: str, msg: Any) -> None:
        addr = self.addrs.get(dst)
        if addr is None:
            log.debug("no address for %s; dropped a %s", dst, type(msg).__name__)
            return
        self._send(addr, self.envelope(msg, uid))

    def _swim_effects(self, now: float) -> None:
        for effect in self.swim.drain_effects():
            if isinstance(effect, HeartbeatObserved):
                self.events.heartbeat(effect)
                continue
            state = effect.state
            if not (state is MemberState.SUSPECT and self.since.get(effect.node_id, (None,))[0] is state):
                self.since[effect.node_id] = (state, now)  # a suspicion told again keeps its start
            self.poke()
            refused = isinstance(effect, MemberSuspect) and effect.refused
            if isinstance(effect, (MemberDead, MemberLeft)):
                self.sightings.declared_dead(effect.node_id, now)
            if isinstance(effect, MemberAlive):
                self.addrs[effect.node_id] = effect.addr
                self.raft.peer_alive(now, effect.node_id)
            elif isinstance(effect, (MemberDead, MemberLeft)) or refused:
                # a refused connection is near proof the process is gone: the successors need not
                # wait out the suspicion (a wrong verdict costs a pre-vote the lease refuses)
                self.raft.leader_lost(now, effect.node_id)
            log.info("member %s is %s (incarnation %d)%s", effect.node_id, state.value, effect.incarnation,
                     " (a connection to it was refused here)" if refused else "")
        if self.raft.has_ready():
            self.drain()


class _NodeReady:
    """consensus.ready.ReadyHandler of a Node: its store, its events, its network."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def persist(self, rd: Ready) -> None:
        persist(self.node.storage, rd)
        if rd.snapshot is not None:
            log.info("installed a snapshot at index %d from the leader", rd.snapshot.index)
        self.node.entries_written += len(rd.entries)

    def apply(self, entries: tuple[Entry, ...]) -> None:
        self.node._applied(self.node.store.apply_to(entries[-1].index))

    def send(self, messages: tuple[Outgoing, ...]) -> None:
        for dst, uid, msg in messages:
            self.node._send_raft(dst, uid, msg)

    def observe(self, rd: Ready) -> None:
        node = self.node
        for rs in rd.read_states:
            fut = node._reads.pop(rs.request_id, None)
            if fut is not None and not fut.done():
                fut.set_result(rs.index)
        if rd.soft_state is not None:
            node._on_soft(rd.soft_state.leader, rd.soft_state.role)


def _resolve(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
