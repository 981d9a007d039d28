"""One node's runtime driver: feeds the membership and consensus cores, persists, sends.

Everything runs on one asyncio loop, so the cores are only ever touched from one thread.
The driver owns the clock and the I/O the pure cores leave to their caller: it persists each
Raft Ready to the store before releasing its messages, turns core messages into Envelopes,
and reports applied entries to whoever waits for them (RPCs, the worker supervisor). Its loop
and chores' schedule are node/timers.py, the commands awaited until applied node/commands.py,
and what the owners above it read of the committed state node/reads.py.
"""

from __future__ import annotations

import logging
import math
import os
import random
from dataclasses import replace
from typing import Any, Callable

from dpeer.clock import REAL, Clock
from dpeer.consensus import Peer, RaftNode, Role
from dpeer.consensus.ready import Outgoing, Ready, drive, persist
from dpeer.consensus.messages import AppendRequest, RaftHeartbeat, SnapshotRequest
from dpeer.errors import BadRequest
from dpeer.ids import SECRETS, Ids
from dpeer.membership import (
    Ack,
    Gossip,
    HeartbeatObserved,
    SeenAlive,
    SeenDead,
    SeenLeft,
    MemberRecord,
    MemberState,
    SeenSuspect,
    Membership,
    Nack,
    Ping,
    PingReq,
    PushPull,
)
from dpeer.daemon.node.commands import NodeCommands
from dpeer.daemon.node.events import NodeEvents, NoEvents
from dpeer.daemon.node.reads import StateReads
from dpeer.daemon.decide.probe_rtt import ProbeTimes
from dpeer.daemon.decide.resync_plan import LocalVersion
from dpeer.daemon.decide.sightings import Sightings, Windows, copy_of, held_twice
from dpeer.daemon.node.storage_adapter import StoreStorage
from dpeer.daemon.node.timers import NodeTimers
from dpeer.daemon.timing import Timing, resolve
from dpeer.transport.api import Envelope
from dpeer.daemon.decide.proposals import Observed
from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.errors import CommittedEntryError, CorruptState, StoreWriteFailed
from dpeer.statemachine.payloads import decode
from dpeer.statemachine.snapshot import decode_snapshot
from dpeer.statemachine.state import ApplyResult, MemberStatus
from dpeer.statemachine.store import Store

log = logging.getLogger("dpeer.node")
Sender = Callable[[str, Envelope], None]
MEMBERSHIP_TYPES = (Ping, Ack, PingReq, Nack, Gossip, PushPull)
# Applied entries that give the chores nothing to react to (a training box commits a checkpoint
# every few hundred steps; waking the chores for each kept a daemon busy beside its worker).
_QUIET_KINDS = frozenset({EntryKind.CHECKPOINT, EntryKind.KV_PUT, EntryKind.NOOP})
_LEADER_MSGS = (AppendRequest, RaftHeartbeat, SnapshotRequest)


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
        self.reads = StateReads(store)
        self.clock, self.wall = clock.now, clock.wall
        self.storage = StoreStorage(store)
        self._sender = sender
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
        self.invalid_messages = 0
        self.write_failure: StoreWriteFailed | None = None  # the store refused a write: the node stopped
        self.admitted_by: str | None = None
        self.entries_written = 0
        self.commands = NodeCommands(self)
        self.timers = NodeTimers(self, self.events, self.clock)

    # -- inputs ---------------------------------------------------------------------------
    def deliver(self, envelope: Envelope) -> None:
        """Take one Envelope from a peer (decoded and validated by the transport); BadRequest when
        it is forged."""
        msg, peer, boot, up = envelope.msg, envelope.sender, envelope.boot, envelope.up
        sender = peer.node_id
        now = self.clock()
        self.sightings.saw(sender, peer.uid, envelope.from_addr, now, boot, up if boot else None)
        self._refuse_copy(peer, boot, now)
        self.raft.observe(peer)
        if isinstance(msg, MEMBERSHIP_TYPES):
            if msg.hb.node_id != sender and not isinstance(msg, Ack):
                raise BadRequest(f"heartbeat of {msg.hb.node_id!r} sent by {sender!r}")
            self.addrs.setdefault(msg.hb.node_id, msg.hb.addr)
            if isinstance(msg, Ack) and msg.hb.node_id == sender:
                self.probes.acked(sender, msg.seq, now)
            self._send_swim(self.swim.receive(now, msg))
            self._swim_effects(now)
        else:
            self._admit_raft(peer, msg)
            self.addrs.setdefault(sender, envelope.from_addr)
            self.raft.step(now, peer, msg, envelope.to_uid)
            try:
                self.drain()
            except CommittedEntryError as exc:
                log.error("the leader %s would overwrite committed entries here (%s): this node's log "
                          "diverged, as after a forced reconfiguration; move its data dir aside and "
                          "rejoin", sender, exc)
                raise BadRequest(f"log diverges from {sender!r} on committed entries") from None
        self.timers.wake_if_sooner()

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
        self.timers.wake_if_sooner()

    def join_seeds(self, seeds: list[str]) -> None:
        """Start gossip through the seed addresses (push-pull with each)."""
        self._send_swim(self.swim.join(self.clock(), seeds))
        self.timers.wake_if_sooner()

    # -- what the loop drives (node/timers.py) ------------------------------------------
    def due(self) -> float:
        """The cores' earliest deadline: Raft's next tick or SWIM's next probe."""
        swim_due = self.swim.next_tick()
        return min(self.raft.next_deadline(), math.inf if swim_due is None else swim_due)

    def tick(self, now: float) -> None:
        """Run the cores' timers that are due now, then act on what they made."""
        if now >= self.raft.next_deadline():
            self.raft.tick(now)
        swim_due = self.swim.next_tick()
        if swim_due is not None and now >= swim_due:
            self._send_swim(self.swim.tick(now))
        self._swim_effects(now)
        self.drain()

    # -- Raft Ready -------------------------------------------------------------------------
    def drain(self) -> None:
        """Handle every pending Ready in the documented order (consensus.ready.drive): persist,
        apply, send. Hard state, new entries and the commit index go to disk in one synced
        transaction; the messages (votes, acknowledgements) leave only after that. A write the
        disk refuses stops the node (fail-stop, as etcd does on a failed WAL write): its memory
        may be ahead of its disk, so it must not send another message."""
        try:
            drive(self.raft, _NodeReady(self))
            if self.store.maybe_snapshot(self.snapshot_every, self.snapshot_keep):
                log.info("snapshot at index %d; log compacted", self.store.snapshot_index)
        except StoreWriteFailed as exc:
            if self.write_failure is None:
                self.write_failure = exc
                log.error("%s; stopping this node now", exc)
                self.timers.stop()
            raise
        self.swim.set_local_version(self.store.current_term, self.store.last_applied, self.store.commit_index)
        self.timers.wake_if_sooner()

    def _on_soft(self, leader: str | None, name: str) -> None:
        role = Role(name)
        if (leader, role) != (self.leader_id, self.role):
            log.info("role %s, leader %s", role.value, leader)
            self.leader_id, self.role = leader, role
            self.timers.poke()
            if leader is not None and leader != self._last_leader:
                self._last_leader = leader  # a lost pre-vote restores the old one: not news
                self.timers.chores_now()  # a failure report owed to the new leader: now, not a chore period later
        if role is not Role.LEADER:
            self.commands.not_leading()

    def _applied(self, done: list[tuple[Entry, ApplyResult]]) -> None:
        if any(entry.kind not in _QUIET_KINDS for entry, _ in done):
            self.timers.poke()
        for entry, result in done:
            if entry.kind is EntryKind.MEMBER_JOINED and result.accepted:  # a refused entry may be malformed
                joined = decode(entry.kind, entry.payload)
                self.addrs[joined.node_id] = joined.addr  # type: ignore[union-attr]
            self.commands.applied(entry, result)
            self.events.applied(entry, result)
        self.commands.applied_up_to(self.store.last_applied)

    # -- resync and force's reachability ----------------------------------------------
    def accept_committed(self, entries: list[Entry], commit_index: int, sender: Peer, sender_term: int) -> bool:
        """Take committed entries fetched from a peer (resync); False when they do not fit or
        the peer may not supply them (see RaftNode.accept_committed)."""
        result = self.raft.accept_committed(entries, commit_index, sender, sender_term)
        if not result.accepted:
            log.info("resync batch from %s refused: %s", sender.node_id, result.reason)
        self.drain()
        return result.accepted

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

    def _send(self, addr: str, envelope: Envelope) -> None:
        """Hand one Envelope to the network, unless a write failed: a stopped node sends nothing,
        Raft or SWIM (an ack from it would keep it alive in its peers' eyes until it exits)."""
        if self.write_failure is None:
            self._sender(addr, envelope)

    def envelope(self, msg: Any, to_uid: str = "") -> Envelope:
        """A core message in an Envelope from this node (its identity, address and boot)."""
        return Envelope(msg, self.raft.identity, self.addr, to_uid, self.boot, self.clock() - self.started)

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
            self.timers.poke()
            refused = isinstance(effect, SeenSuspect) and effect.refused
            if isinstance(effect, (SeenDead, SeenLeft)):
                self.sightings.declared_dead(effect.node_id, now)
            if isinstance(effect, SeenAlive):
                self.addrs[effect.node_id] = effect.addr
                self.raft.peer_alive(now, effect.node_id)
            elif isinstance(effect, (SeenDead, SeenLeft)) or refused:
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
            node.commands.read_answered(rs.request_id, rs.index)
        if rd.soft_state is not None:
            node._on_soft(rd.soft_state.leader, rd.soft_state.role)

