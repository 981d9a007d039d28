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
import math
import random
from typing import Any, Mapping

from dpeer.consensus.config import RaftConfig
from dpeer.consensus.entry import Entry, RaftKind, storable
from dpeer.consensus.follower import FollowerSide
from dpeer.consensus.force import ForceSide
from dpeer.consensus.identity import IdentitySide
from dpeer.consensus.log import RaftLog
from dpeer.consensus.messages import (
    LEADER_LEASE,
    AppendRequest,
    AppendResponse,
    RaftHeartbeat,
    RaftHeartbeatResponse,
    Message,
    Peer,
    SnapshotRequest,
    VoteRequest,
    VoteResponse,
)
from dpeer.consensus.progress import Tracker
from dpeer.consensus.replication import LeaderSide
from dpeer.consensus.ready import (
    HardState,
    NotLeader,
    Outgoing,
    Proposed,
    ProposeResult,
    ReadRequested,
    ReadResult,
    ReadState,
    Ready,
    Refused,
    Role,
    SoftState,
)
from dpeer.consensus.storage import Storage
from dpeer.consensus.succession import LEASE_RETRY, successor_delay
from dpeer.consensus.voting import (
    ChangeOp,
    VotingConfig,
    ConfigChangeError,
    history_after_append,
    load_history,
    pruned_history,
)

log = logging.getLogger(__name__)
_LEADER_MSGS = (AppendRequest, RaftHeartbeat, SnapshotRequest)


class RaftNode(LeaderSide, FollowerSide, ForceSide, IdentitySide):
    """One node's Raft state; restartable from Storage alone (see the module docstring).

    Identity bookkeeping, for the caller's status and the leader's replacement of lost members:
    seen_uids (the last store uid seen from each node id), newest_epoch (the highest cluster epoch
    any peer follows), old_epoch_peers (non-members of an older epoch whose messages were
    refused), diverged_at (an index where a leader's entry differed from our committed one)."""

    def __init__(self, node_id: str, storage: Storage, config: RaftConfig,
                 rng: random.Random, now: float) -> None:
        self.id, self.cfg, self._rng, self._now = node_id, config, rng, now
        self.uid = storage.uid
        self.log = RaftLog(storage)
        self.term: int = storage.current_term
        self.voted_for: str | None = storage.voted_for
        self.role = Role.FOLLOWER
        self.leader: str | None = None
        self._conf_history = load_history(storage)
        self.tracker = Tracker(self.membership)
        self._msgs: list[Outgoing] = []
        self._read_states: list[ReadState] = []
        self._votes: dict[str, bool] = {}
        self._prev_hard = HardState(self.term, self.voted_for, self.log.committed)
        self._prev_soft = SoftState(None, Role.FOLLOWER)
        self._pending_conf_index = 0
        self._leader_contact = -math.inf
        self._lease = config.election_timeout_min
        self._hint: str | None = None  # the leader before a pre-vote, restored if it fails
        self._lost: str | None = None  # the leader leader_lost() named, until it or a successor is heard
        self._lost_at = -math.inf
        self._lost_rounds = 0  # pre-vote rounds since that verdict (the lease retry's wait doubles per round)
        self._active_at = now
        self._election_deadline = now + self._random_timeout()
        self._heartbeat_due = self._quorum_check_due = math.inf
        self._learner_heartbeat_due = -math.inf
        self._beat_idle = False
        self._read_seq = 0
        self._pending_reads: list[list[Any]] = []  # [request_id, index or None]
        self._leader_seen_at = now  # when a leader (or this node leading) was last known
        self._heard: dict[str, float] = {}  # when each member last reached us under its uid
        self._peer: Peer | None = None  # the sender of the message being stepped
        self.seen_uids: dict[str, str] = {}
        self.newest_epoch = self.epoch
        self.old_epoch_peers: dict[str, int] = {}
        self.diverged_at = 0

    # -- public state -----------------------------------------------------------------------
    @property
    def membership(self) -> VotingConfig:
        """The configuration in force: the last one in the log, committed or not."""
        return self._conf_history[-1][1]

    @property
    def commit_index(self) -> int:
        """Highest index known committed."""
        return self.log.committed

    def next_deadline(self) -> float:
        """When the caller should next call tick()."""
        if self.role is Role.LEADER:
            return min(self._heartbeat_due, self._quorum_check_due)
        return self._election_deadline

    # -- inputs -----------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Advance timers to now: heartbeats and check-quorum as leader, elections otherwise."""
        self._now = now
        if self.role is Role.LEADER:
            self._leader_seen_at = now
            self._tick_leader(now)
        elif now >= self._election_deadline:
            self._reset_election_timer()
            if self._promotable():
                self._campaign(pre_vote=True)

    def leader_lost(self, now: float, node: str) -> None:
        """The failure detector declared `node` dead, gone or not listening: if it is our leader,
        drop its lease and campaign at our place among its successors (see succession.py). A leader
        that loses a voter checks its quorum afresh (see recheck_quorum). Only timers move: a
        wrong verdict costs a rejected pre-vote, since the voters that still hear the leader
        keep its lease."""
        self._now = now
        if self.role is Role.LEADER:
            if node in self.membership.voters and node != self.id:
                self.recheck_quorum(now)
            return
        if node != self.leader:
            return
        if self._lost != node or self._heard_since_lost():  # a verdict told again keeps its start
            self._lost, self._lost_at, self._lost_rounds = node, now, 0
        self._leader_contact = -math.inf
        self._election_deadline = min(self._election_deadline, now + successor_delay(
            self.membership.voters, self.id, node, self.cfg.election_timeout_min, self._rng.random()))

    def step(self, now: float, sender: Peer, msg: Message, to_uid: str) -> None:
        """Handle one message from sender, meant for the store to_uid; raises InvalidRaftMessage on
        absurd fields. A message meant for another store is dropped (a box back on a new disk
        never answers for the store it replaced), and so is an answer (a vote, an
        acknowledgement) from a node the configuration names with another uid, so it is never
        counted. Requests are taken from anyone, as Raft's rule is: our configuration may be
        older than the sender's, and the sender addressed this very store."""
        msg.validate()
        sender.validate()
        self._now = now
        src = sender.node_id
        if src == self.id or (isinstance(msg, _LEADER_MSGS) and msg.leader != src):
            return
        if isinstance(msg, VoteRequest) and msg.candidate != src:
            return
        self.observe(sender)
        if self.superseded and self.role is not Role.FOLLOWER:
            log.warning("%s: a peer follows cluster epoch %d, this node epoch %d (a forced reconfiguration "
                        "gave up on it): it stops %s", self.id, self.newest_epoch, self.epoch, self.role)
            self._become_follower(self.term, None)
        if to_uid != self.uid or not self._admit(sender, msg):
            return
        if self.role is Role.LEADER:
            self._leader_seen_at = now
        self._peer = sender
        try:
            if msg.term > self.term and not self._on_higher_term(src, msg):
                return
            if msg.term < self.term:
                self._on_lower_term(src, msg)
                return
            self._dispatch(src, msg, sender.epoch)
        finally:
            self._peer = None

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
        entry = self._leader_append(kind, dict(payload))
        return Proposed(entry.index, entry.term)

    def change_membership(self, op: ChangeOp | str, node: str, uid: str = "") -> ProposeResult:
        """Propose one single-server change (add_learner and add_voter with the node's store
        uid, promote, remove)."""
        if self.role is not Role.LEADER:
            return NotLeader(self.leader)
        if self._pending_conf_index > self.log.committed:
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
        entry = self._leader_append(RaftKind.CONFIG_CHANGE, new.to_payload())
        self._pending_conf_index = entry.index
        return Proposed(entry.index, entry.term)

    def removal_refusal(self, node: str) -> Refused | None:
        """On the leader: refuse removing a voter when the voters that remain hold no live quorum
        (etcd's strict reconfiguration check): with another voter down or replaced, the removal
        would commit and leave a configuration that can never commit again."""
        remaining = [v for v in self.membership.voters if v != node]
        if self.role is not Role.LEADER or node not in self.membership.voters or not remaining:
            return None  # not the leader: the proposal that follows says so; no voter left: nothing to judge
        # two of the slowest beats a live voter answers (idle beats are the slowest)
        since = self._now - 2 * max(self.cfg.election_timeout_max, self.cfg.idle_heartbeat_interval)
        live = self.tracker.live(remaining, self.id, since)
        if len(live) > len(remaining) // 2:
            return None
        silent = sorted(set(remaining) - set(live))
        return Refused(f"removing voter {node!r} would leave voters {sorted(remaining)}, of which {silent} have not "
                       f"answered for {self._now - since:.1f}s: no live quorum; bring them back or replace them first")

    def read_index(self) -> ReadResult:
        """Start a linearizable read: a ReadState(request_id, index) follows once a quorum
        confirmed this leadership; read local state once applied >= index. Reads are dropped
        (the caller times out and retries) if leadership is lost first."""
        if self.role is not Role.LEADER:
            return NotLeader(self.leader)
        self._read_seq += 1
        index = self.log.committed if self._committed_in_term() else None
        self._pending_reads.append([self._read_seq, index])
        self._mark_active()
        self._broadcast_heartbeat(learners=False)
        self._check_reads()
        return ReadRequested(self._read_seq)

    # -- Ready / advance --------------------------------------------------------------------
    def has_ready(self) -> bool:
        """True when ready() has work for the caller."""
        lg = self.log
        return bool(
            self._msgs or lg.unstable or lg.pending_snapshot or self._read_states
            or (lg.committed > lg.applied and lg.pending_snapshot is None)
            or self._hard_state() != self._prev_hard or self._soft_state() != self._prev_soft
        )

    def ready(self) -> Ready:
        """Collect the work to do; hand the same object to advance() when done."""
        hard, soft = self._hard_state(), self._soft_state()
        rd = Ready(
            hard_state=hard if hard != self._prev_hard else None,
            soft_state=soft if soft != self._prev_soft else None,
            entries=tuple(self.log.unstable),
            snapshot=self.log.pending_snapshot,
            committed_entries=tuple(self.log.next_committed()),
            messages=tuple(self._msgs),
            read_states=tuple(self._read_states),
        )
        self._msgs, self._read_states = [], []
        return rd

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
        self._conf_history = pruned_history(self._conf_history, self.log.committed)
        if self.role is Role.LEADER and self.id in self.tracker.progress:
            self.tracker.progress[self.id].maybe_update(self.log.stable_index())
            if self._maybe_commit():
                self._broadcast_append()

    def _hard_state(self) -> HardState:
        return HardState(self.term, self.voted_for, self.log.committed)

    def _soft_state(self) -> SoftState:
        return SoftState(self.leader, self.role)

    # -- term handling and dispatch ---------------------------------------------------------
    def _on_higher_term(self, src: str, msg: Message) -> bool:
        """Adopt a higher term unless it is a (pre-)vote we must not let disrupt us."""
        if isinstance(msg, VoteRequest):
            if self._in_lease():
                self._reply(VoteResponse(self.term, False, msg.pre_vote, LEADER_LEASE))
                return False
            if not msg.pre_vote:
                self._become_follower(msg.term, None)
            return True
        if isinstance(msg, VoteResponse) and msg.pre_vote and msg.granted:
            return True
        self._become_follower(msg.term, src if isinstance(msg, _LEADER_MSGS) else None)
        return True

    def _on_lower_term(self, src: str, msg: Message) -> None:
        """Tell a stale leader or pre-candidate about our term; ignore everything else."""
        if isinstance(msg, _LEADER_MSGS):
            self._reply(AppendResponse(self.term, False, 0))
        elif isinstance(msg, VoteRequest) and msg.pre_vote:
            self._reply(VoteResponse(self.term, False, True, "stale_term"))

    def _dispatch(self, src: str, msg: Message, epoch: int) -> None:
        if isinstance(msg, VoteRequest):
            self._on_vote_request(src, msg, epoch)
        elif isinstance(msg, VoteResponse):
            self._on_vote_response(src, msg)
        elif isinstance(msg, _LEADER_MSGS):
            self._on_leader_message(src, msg)
        elif self.role is Role.LEADER and isinstance(msg, AppendResponse):
            self._on_append_response(src, msg)
        elif self.role is Role.LEADER and isinstance(msg, RaftHeartbeatResponse):
            self._on_heartbeat_response(src, msg)

    def _in_lease(self) -> bool:
        """Heard from a live leader within its lease (or we lead): election_timeout_min, or
        idle_election_timeout after an idle beat; leader_lost() ends it."""
        if self.role is Role.LEADER:
            return True
        recent = self._now - self._leader_contact < self._lease
        return self.leader is not None and recent

    # -- elections --------------------------------------------------------------------------
    def _promotable(self) -> bool:
        """A voter under its own store uid, with no snapshot pending, of the newest epoch known."""
        return (self.membership.is_voter(self.id, self.uid) and self.log.pending_snapshot is None
                and not self.superseded)

    def _random_timeout(self, idle: bool = False) -> float:
        if idle:
            return self._rng.uniform(self.cfg.idle_election_timeout, 1.5 * self.cfg.idle_election_timeout)
        return self._rng.uniform(self.cfg.election_timeout_min, self.cfg.election_timeout_max)

    def _reset_election_timer(self, idle: bool = False) -> None:
        self._election_deadline = self._now + self._random_timeout(idle)

    def _campaign(self, pre_vote: bool) -> None:
        """Ask every voter for a (pre-)vote; a pre-vote keeps our term unchanged."""
        if pre_vote:
            self._hint = self.leader or self._hint
            self.role, self.leader = Role.PRE_CANDIDATE, None
            self._lost_rounds += 1
            vote_term = self.term + 1
        else:
            self.term, self.voted_for = self.term + 1, self.id
            self.role, self.leader, vote_term = Role.CANDIDATE, None, self.term
        self._votes = {self.id: True}
        self._reset_election_timer()
        req = VoteRequest(vote_term, self.id, self.log.last_index(), self.log.last_term(), pre_vote)
        for peer in sorted(self.membership.voters - {self.id}):
            self._send(peer, req)
        self._tally()

    def _on_vote_request(self, src: str, m: VoteRequest, epoch: int) -> None:
        """Grant iff we may vote for src in m.term, src follows the newest epoch we know of, and
        its log is at least as up to date as ours (the candidate counts the vote only if its
        configuration names us with our uid)."""
        can_vote = (
            self.voted_for == src
            or (self.voted_for is None and self.leader is None)
            or (m.pre_vote and m.term > self.term)
        )
        if epoch < self.newest_epoch:
            self._reply(VoteResponse(self.term, False, m.pre_vote, "old_epoch"))
        elif not can_vote:
            self._reply(VoteResponse(self.term, False, m.pre_vote, "already_voted"))
        elif not self.log.is_up_to_date(m.last_index, m.last_term):
            self._reply(VoteResponse(self.term, False, m.pre_vote, "log_behind"))
        else:
            if not m.pre_vote:
                self.voted_for = src
                self._reset_election_timer()
            self._reply(VoteResponse(m.term, True, m.pre_vote))

    def _on_vote_response(self, src: str, m: VoteResponse) -> None:
        if src == self._lost and not m.granted:
            self._lost = None  # the leader we declared lost answers: the verdict was wrong, no lease retries
            if self.role is Role.FOLLOWER:
                self._reset_election_timer()  # drop a retry armed before its answer came
        pre = self.role is Role.PRE_CANDIDATE
        if self.role not in (Role.PRE_CANDIDATE, Role.CANDIDATE) or m.pre_vote != pre:
            return
        if m.granted and m.term != self.term + (1 if pre else 0):
            return
        if src in self.membership.voters:
            # Pre-vote rounds share a term, so a refusal may be a late answer to an earlier round: a
            # grant replaces it (a grant is always sound to count; a real vote is granted once per term).
            if m.granted or src not in self._votes:
                self._votes[src] = m.granted
            self._tally()
            if pre and not m.granted and m.reason == LEADER_LEASE:
                self._retry_after_lease()

    def _retry_after_lease(self) -> None:
        """A voter refused our pre-vote because it still holds the lost leader's lease: its own
        detector has not caught up yet (we campaign the moment ours did), so ask again soon, the
        wait doubling with each round (however many voters refused in it), until
        election_timeout_min after the verdict, when every such lease has run out anyway. Runs after
        the tally, so a refusal that lost the round re-arms the retry the fallback timer replaced."""
        if self._heard_since_lost():
            self._lost = None
        wait = self.cfg.heartbeat_interval * LEASE_RETRY * 2 ** max(0, self._lost_rounds - 1)
        if self._lost is None or self._now + wait > self._lost_at + self.cfg.election_timeout_min:
            return
        self._election_deadline = min(self._election_deadline, self._now + wait)

    def _heard_since_lost(self) -> bool:
        """A leader's message reached us after the verdict of leader_lost(): it no longer stands."""
        return self._leader_contact >= self._lost_at

    def _tally(self) -> None:
        voters = self.membership.voters
        granted = sum(1 for n, ok in self._votes.items() if ok and n in voters)
        rejected = sum(1 for n, ok in self._votes.items() if not ok and n in voters)
        if granted >= self.membership.quorum:
            if self.role is Role.PRE_CANDIDATE:
                self._campaign(pre_vote=False)
            else:
                self._become_leader()
        elif len(voters) - rejected < self.membership.quorum:
            # A lost pre-vote changed no term: the leader we knew is still the best guess.
            self._become_follower(self.term, self._hint if self.role is Role.PRE_CANDIDATE else None)

    def _become_follower(self, term: int, leader: str | None) -> None:
        if term > self.term:
            self.term, self.voted_for = term, None
        self._hint = None
        self.role, self.leader, self._votes = Role.FOLLOWER, leader, {}
        self._heartbeat_due = self._quorum_check_due = math.inf
        self._pending_reads = []
        self._reset_election_timer()

    def _become_leader(self) -> None:
        self.role, self.leader, self._votes = Role.LEADER, self.id, {}
        self._leader_seen_at = self._now
        self.tracker.progress = {}
        self.tracker.reset(self.membership, self.log.last_index())
        for pr in self.tracker.progress.values():
            pr.recent_active = True  # a check-quorum window of grace; heard_at waits for a real answer
        if self.id in self.tracker.progress:
            self.tracker.progress[self.id].maybe_update(self.log.stable_index())
        self._heartbeat_due = self._now + self.cfg.heartbeat_interval
        self._learner_heartbeat_due = self._now + self.cfg.learner_heartbeat_interval
        self._quorum_check_due = self._now + self.cfg.election_timeout_min
        self._leader_append(RaftKind.NOOP, {})
        self._pending_conf_index = self.log.last_index()

    # -- plumbing ---------------------------------------------------------------------------
    def _send(self, dst: str, msg: Any) -> None:
        """Queue msg for member dst, meant for the store uid the configuration names for it."""
        uid = self.membership.uid_of(dst)
        if uid is not None:
            self._msgs.append(Outgoing(dst, uid, msg))

    def _reply(self, msg: Any) -> None:
        """Queue msg for the sender of the message being stepped, meant for its store."""
        assert self._peer is not None
        self._msgs.append(Outgoing(self._peer.node_id, self._peer.uid, msg))

    def _append(self, entries: list[Entry]) -> None:
        """Append to the log and follow any configuration it adds or truncates away."""
        self.log.append(entries)
        before = self.membership
        self._conf_history = history_after_append(self._conf_history, entries)
        if self.membership != before and self.role is Role.LEADER:
            self.tracker.reset(self.membership, self.log.last_index())
