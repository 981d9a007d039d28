"""RaftNode: the Raft algorithm as a pure state machine (etcd-io/raft's shape, Python-sized).

Contract. The caller owns the clock, the disk and the network:
- feed it: step(now, sender, msg, to_uid) for each validated incoming message (sender: the
  Peer that sent it, to_uid: the store uid it was meant for), observe(sender) for any other
  message from a peer (gossip), tick(now) when now >= next_deadline(), propose /
  change_membership / read_index / accept_committed / force_new_configuration;
- drain it: while has_ready(): rd = ready(); persist it (ready.persist: install rd.snapshot,
  then save rd.hard_state and rd.entries in one durable write); then send rd.messages, each
  stamped with `identity`, and apply rd.committed_entries in order (either first; see ready.py);
  advance(rd). Never step between ready() and advance().
Features: pre-vote, check-quorum, leader lease on votes, fast log backoff, snapshots, learners,
single-server membership changes, ReadIndex, committed-entry resync from members, idle leaders
that beat slowly, with leader_lost(node) as the failure detector's shortcut to an election,
member identities (node id + store uid) and cluster epochs (see voting.py), and a guarded
forced reconfiguration (force.py).
"""

from __future__ import annotations

import logging
import random
from typing import Any, Collection, Iterable, Mapping

from dpeer.consensus.config import RaftConfig
from dpeer.consensus.entry import Entry, RaftKind, storable
from dpeer.consensus.election import LEADER_MSGS, Election
from dpeer.consensus.follower import Follower
from dpeer.consensus.force import force
from dpeer.consensus.identity import ANSWERS, answer_window, old_epoch_reply
from dpeer.consensus.log import RaftLog
from dpeer.consensus.messages import (
    AppendResponse,
    RaftHeartbeatResponse,
    Message,
    Peer,
    VoteRequest,
    VoteResponse,
)
from dpeer.consensus.outbox import Outbox
from dpeer.consensus.progress import Tracker
from dpeer.consensus.reads import ReadIndex
from dpeer.consensus.replication import Leadership
from dpeer.consensus.ready import (
    AcceptResult,
    HardState,
    NotLeader,
    Proposed,
    ProposeResult,
    ReadRequested,
    ReadResult,
    Ready,
    Refused,
    Role,
    SoftState,
)
from dpeer.consensus.storage import Storage
from dpeer.consensus.voting import ChangeOp, ConfigChangeError, ConfigHistory, VotingConfig

log = logging.getLogger(__name__)


class RaftNode:
    """One node's Raft state; restartable from Storage alone (see the module docstring).

    It holds what every part reads (id, uid, cfg, term, voted_for, role, leader, the log, the
    configurations, `now` of the input being handled) and delegates to its parts: election
    (votes, timer, lease), lead (the leader's timers and replication) with tracker (its view of
    each follower) and reads (ReadIndex), follower (leader messages, resync) and out (the
    messages for the next Ready). Identity bookkeeping, for the caller's status and the leader's
    replacement of lost members: seen_uids (the last store uid seen from each node id),
    newest_epoch (the highest cluster epoch any peer follows), old_epoch_peers (non-members of
    an older epoch whose messages were refused)."""

    def __init__(self, node_id: str, storage: Storage, config: RaftConfig,
                 rng: random.Random, now: float) -> None:
        self.id, self.cfg, self.now = node_id, config, now
        self.uid = storage.uid
        self.log = RaftLog(storage)
        self.term: int = storage.current_term
        self.voted_for: str | None = storage.voted_for
        self.role = Role.FOLLOWER
        self.leader: str | None = None
        self.confs = ConfigHistory(storage)
        self.tracker = Tracker(self.membership)
        self.out = Outbox(lambda member: self.membership.uid_of(member))
        self.reads = ReadIndex()
        self.election = Election(self, rng, now)
        self.lead = Leadership(self, now)
        self.follower = Follower(self)
        self._prev_hard = HardState(self.term, self.voted_for, self.log.committed)
        self._prev_soft = SoftState(None, Role.FOLLOWER)
        self.heard: dict[str, float] = {}  # when each member last reached us under its uid
        self.seen_uids: dict[str, str] = {}
        self.newest_epoch = self.epoch
        self.old_epoch_peers: dict[str, int] = {}

    # -- public state -----------------------------------------------------------------------
    @property
    def membership(self) -> VotingConfig:
        """The configuration in force: the last one in the log, committed or not."""
        return self.confs.current

    @property
    def commit_index(self) -> int:
        """Highest index known committed."""
        return self.log.committed

    @property
    def epoch(self) -> int:
        """The cluster epoch of the configuration in force (0 before any)."""
        return self.membership.epoch

    @property
    def identity(self) -> Peer:
        """How this node signs what it sends: node id, store uid, cluster epoch."""
        return Peer(self.id, self.uid, self.epoch)

    def next_deadline(self) -> float:
        """When the caller should next call tick()."""
        if self.role is Role.LEADER:
            return self.lead.next_deadline()
        return self.election.deadline

    def leaderless_for(self, now: float) -> float:
        """Seconds since this node last knew a leader (0 while it leads)."""
        return 0.0 if self.role is Role.LEADER else max(0.0, now - self.election.leader_seen_at)

    def strangers(self) -> dict[str, str]:
        """Members of the configuration in force last seen with another store uid than the one
        it names (a box that lost its disk): node id -> the uid seen."""
        conf = self.membership
        return {n: u for n, u in self.seen_uids.items() if conf.uid_of(n) not in (None, u)}

    def answering_voters(self, now: float) -> set[str] | None:
        """On the leader: the voters that answered it under the store uid the configuration names
        within two of the slowest beats a live voter answers (itself included), as the strict
        reconfiguration check counts them; None on any other node."""
        if self.role is not Role.LEADER:
            return None
        since = now - answer_window(self.cfg)
        return set(self.tracker.live(sorted(self.membership.voters), self.id, since))

    # -- inputs -----------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Advance timers to now: heartbeats and check-quorum as leader, elections otherwise."""
        self.now = now
        if self.role is Role.LEADER:
            self.election.leader_seen_at = now
            self.lead.tick(now)
        else:
            self.election.tick(now)

    def leader_lost(self, now: float, node: str) -> None:
        """The failure detector declared `node` dead, gone or not listening: if it is our leader,
        drop its lease and campaign at our place among its successors (see succession.py). A leader
        that loses a voter checks its quorum afresh (see Leadership.recheck_quorum). Only timers
        move: a wrong verdict costs a rejected pre-vote, since the voters that still hear the
        leader keep its lease."""
        self.now = now
        if self.role is Role.LEADER:
            if node in self.membership.voters and node != self.id:
                self.lead.recheck_quorum()
            return
        if node == self.leader:
            self.election.leader_lost(now, node)

    def peer_alive(self, now: float, node: str) -> None:
        """The failure detector sees `node` alive again (restarted, or back from a partition):
        as leader, beat it now, so it learns the leader without waiting for an idle beat."""
        self.now = now
        if self.role is Role.LEADER:
            self.lead.beat(node)

    def observe(self, sender: Peer) -> None:
        """Note a peer's identity from any message it sent (gossip included), and its epoch when
        the configuration names it with that uid (a stranger cannot silence us with a big one)."""
        self.seen_uids[sender.node_id] = sender.uid
        if self.membership.is_member(sender.node_id, sender.uid):
            self.newest_epoch = max(self.newest_epoch, sender.epoch)

    def step(self, now: float, sender: Peer, msg: Message, to_uid: str) -> None:
        """Handle one message from sender, meant for the store to_uid; raises InvalidRaftMessage on
        absurd fields. A message meant for another store is dropped (a box back on a new disk
        never answers for the store it replaced), and so is an answer (a vote, an
        acknowledgement) from a node the configuration names with another uid, so it is never
        counted. Requests are taken from anyone, as Raft's rule is: our configuration may be
        older than the sender's, and the sender addressed this very store."""
        msg.validate()
        sender.validate()
        self.now = now
        src = sender.node_id
        if src == self.id or (isinstance(msg, LEADER_MSGS) and msg.leader != src):
            return
        if isinstance(msg, VoteRequest) and msg.candidate != src:
            return
        self.observe(sender)
        if self.newest_epoch > self.epoch and self.role is not Role.FOLLOWER:  # superseded (see identity.py)
            log.warning("%s: a peer follows cluster epoch %d, this node epoch %d (a forced reconfiguration "
                        "gave up on it): it stops %s", self.id, self.newest_epoch, self.epoch, self.role)
            self.election.follow(self.term, None)
        if to_uid != self.uid or not self._admit(sender, msg):
            return
        if self.role is Role.LEADER:
            self.election.leader_seen_at = now
        self.out.peer = sender
        try:
            if msg.term > self.term and not self.election.on_higher_term(src, msg):
                return
            if msg.term < self.term:
                self.election.on_lower_term(msg)
            elif isinstance(msg, VoteRequest):
                self.election.on_vote_request(src, msg, sender.epoch)
            elif isinstance(msg, VoteResponse):
                self.election.on_vote_response(src, msg)
            elif isinstance(msg, LEADER_MSGS):
                self.follower.on_leader_message(src, msg)
            elif self.role is Role.LEADER and isinstance(msg, AppendResponse):
                self.lead.on_append_response(src, msg)
            elif self.role is Role.LEADER and isinstance(msg, RaftHeartbeatResponse):
                self.lead.on_heartbeat_response(src, msg)
        finally:
            self.out.peer = None

    def _admit(self, sender: Peer, msg: Message) -> bool:
        """Whether the core may act on a message of sender (see step). A non-member of an older
        epoch (a voter given up on by a forced reconfiguration that came back on its old disk) is
        noted, and a request of it answered so our reply, stamped with our epoch, tells it to stop
        campaigning or leading."""
        src, conf = sender.node_id, self.membership
        named = conf.uid_of(src)
        if named == sender.uid:
            self.heard[src] = self.now
            return True
        if named is None and 0 < sender.epoch < conf.epoch:
            if src not in self.old_epoch_peers:
                log.warning("%s: refusing %s, a member of cluster epoch %d; this cluster is in epoch %d since a "
                            "forced reconfiguration: %s must move its data dir aside and rejoin as a new member",
                            self.id, src, sender.epoch, self.epoch, src)
            self.old_epoch_peers[src] = sender.epoch
            reply = old_epoch_reply(self.term, msg)
            if reply is not None:
                self.out.to(sender, reply)
            return False
        return not isinstance(msg, ANSWERS)

    # -- proposals --------------------------------------------------------------------------
    def propose(self, kind: str, payload: Mapping[str, Any]) -> ProposeResult:
        """Append an entry as leader; config changes go through change_membership.

        The kind and payload are opaque here: the core never reads them. What they mean, and
        whether they are well formed, is the state machine's (statemachine/payloads.py builds and
        checks them); the core refuses only what cannot be stored or sent."""
        if self.role is not Role.LEADER:
            return NotLeader(self.leader)
        if not isinstance(kind, str) or not kind:
            return Refused(f"unknown entry kind {kind!r}")
        if kind == RaftKind.CONFIG_CHANGE:
            return Refused("use change_membership for configuration changes")
        try:
            storable(Entry(self.log.last_index() + 1, self.term, kind, dict(payload)))
        except (ValueError, TypeError, OverflowError) as exc:  # not a dict of str keys or not msgpack-able
            return Refused(f"the payload cannot be stored: {exc}")
        entry = self.lead.append(kind, dict(payload))
        return Proposed(entry.index, entry.term)

    def change_membership(self, op: ChangeOp | str, node: str, uid: str = "") -> ProposeResult:
        """Propose one single-server change (add_learner and add_voter with the node's store
        uid, promote, remove)."""
        if self.role is not Role.LEADER:
            return NotLeader(self.leader)
        if self.lead.pending_conf_index > self.log.committed:
            return Refused("a configuration change is still pending")
        op = ChangeOp(op)
        try:
            new = self.membership.changed(op, node, self.cfg.max_voters, uid)
        except ConfigChangeError as exc:
            return Refused(str(exc))
        if op is ChangeOp.PROMOTE and self.tracker.progress[node].match < self.log.committed:
            return Refused(f"learner {node!r} has not caught up with the commit index yet")
        if op is ChangeOp.REMOVE and (refusal := self.removal_refusal(node)) is not None:
            return refusal
        entry = self.lead.append(RaftKind.CONFIG_CHANGE, new.to_payload())
        self.lead.pending_conf_index = entry.index
        return Proposed(entry.index, entry.term)

    def removal_refusal(self, node: str) -> Refused | None:
        """On the leader: why removing voter node must be refused (no live quorum would remain), or
        None (see Leadership.removal_refusal)."""
        return self.lead.removal_refusal(node)

    def read_index(self) -> ReadResult:
        """Start a linearizable read: a ReadState(request_id, index) follows once a quorum
        confirmed this leadership; read local state once applied >= index. Reads are dropped
        (the caller times out and retries) if leadership is lost first."""
        if self.role is not Role.LEADER:
            return NotLeader(self.leader)
        request_id = self.reads.request(self.log.committed if self.lead.committed_in_term() else None)
        self.lead.mark_active()
        self.lead.broadcast_heartbeat(learners=False)
        self.reads.confirm(self.tracker, self.id)
        return ReadRequested(request_id)

    def accept_committed(self, entries: Iterable[Entry], commit_index: int, sender: Peer,
                         sender_term: int) -> AcceptResult:
        """Take entries committed elsewhere, fetched from sender (see Follower.accept_committed)."""
        return self.follower.accept_committed(entries, commit_index, sender, sender_term)

    def force_new_configuration(self, now: float, voters: Iterable[str], alive: Collection[str],
                                forced_at: float) -> ProposeResult:
        """UNSAFE BY DESIGN, the operator's last resort after losing a majority of voters for good:
        make `voters` the only voters in the next epoch, unless refused (see force.py)."""
        self.now = now
        return force(self, set(voters), alive, forced_at)

    # -- Ready / advance --------------------------------------------------------------------
    def has_ready(self) -> bool:
        """True when ready() has work for the caller."""
        lg = self.log
        return bool(
            self.out.msgs or lg.unstable or lg.pending_snapshot or self.reads.states
            or (lg.committed > lg.applied and lg.pending_snapshot is None)
            or HardState(self.term, self.voted_for, lg.committed) != self._prev_hard
            or SoftState(self.leader, self.role) != self._prev_soft
        )

    def ready(self) -> Ready:
        """Collect the work to do; hand the same object to advance() when done."""
        hard, soft = HardState(self.term, self.voted_for, self.log.committed), SoftState(self.leader, self.role)
        return Ready(
            hard_state=hard if hard != self._prev_hard else None,
            soft_state=soft if soft != self._prev_soft else None,
            entries=tuple(self.log.unstable),
            snapshot=self.log.pending_snapshot,
            committed_entries=tuple(self.log.next_committed()),
            messages=tuple(self.out.take()),
            read_states=tuple(self.reads.take()),
        )

    def advance(self, rd: Ready) -> None:
        """The caller persisted, applied and sent everything in rd."""
        if rd.hard_state is not None:
            self._prev_hard = rd.hard_state
        if rd.soft_state is not None:
            self._prev_soft = rd.soft_state
        if rd.snapshot is not None:
            self.log.snapshot_installed(rd.snapshot.index)
        if rd.entries:
            self.log.stable_to(rd.entries[-1].index, rd.entries[-1].term)
        if rd.committed_entries:
            self.log.applied_to(rd.committed_entries[-1].index)
        self.confs.committed(self.log.committed)
        if self.role is Role.LEADER and self.id in self.tracker.progress:
            self.tracker.progress[self.id].maybe_update(self.log.stable_index())
            if self.lead.maybe_commit():
                self.lead.broadcast_append()
