"""RaftNode: the Raft algorithm as a pure state machine (etcd-io/raft's shape, Python-sized).

Contract. The caller owns the clock, the disk and the network:
- feed it: step(now, src, msg) for each validated incoming message, tick(now) when
  now >= next_deadline(), propose / change_membership / read_index / accept_committed;
- drain it: while has_ready(): rd = ready(); persist rd.hard_state (term, vote), install
  rd.snapshot, append rd.entries, set_commit(rd.hard_state.commit); apply rd.committed_entries
  in order; send rd.messages; advance(rd). Never step between ready() and advance().
Features: pre-vote, check-quorum, leader lease on votes, fast log backoff, snapshots, learners,
single-server membership changes, ReadIndex, committed-entry resync from any peer, idle leaders
that beat slowly, with leader_lost(node) as the failure detector's shortcut to an election.
"""

from __future__ import annotations

import logging
import math
import random
from enum import Enum
from typing import Any, Iterable, Mapping

from dpeer.peer.consensus.config import RaftConfig
from dpeer.peer.consensus.log import RaftLog, check_committed_batch
from dpeer.peer.consensus.membership import ChangeOp, Membership, MembershipError
from dpeer.peer.consensus.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    Message,
    SnapshotRequest,
    VoteRequest,
    VoteResponse,
)
from dpeer.peer.consensus.progress import Tracker
from dpeer.peer.consensus.replication import LeaderSide
from dpeer.peer.consensus.ready import (
    AcceptResult,
    HardState,
    NotLeader,
    Proposed,
    ProposeResult,
    ReadRequested,
    ReadResult,
    ReadState,
    Ready,
    Refused,
    SoftState,
)
from dpeer.peer.consensus.storage import Snapshot, Storage
from dpeer.peer.consensus.succession import successor_delay
from dpeer.statemachine.entry import Entry, EntryKind, payload_ok

log = logging.getLogger(__name__)
_LEADER_MSGS = (AppendRequest, Heartbeat, SnapshotRequest)


class Role(str, Enum):
    """A node's role in its current term."""

    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class RaftNode(LeaderSide):
    """One node's Raft state; restartable from Storage alone (see the module docstring)."""

    def __init__(self, node_id: str, storage: Storage, config: RaftConfig,
                 rng: random.Random, now: float) -> None:
        self.id, self.cfg, self._rng, self._now = node_id, config, rng, now
        self.log = RaftLog(storage)
        self.term: int = storage.current_term
        self.voted_for: str | None = storage.voted_for
        self.role = Role.FOLLOWER
        self.leader: str | None = None
        self._conf_history = _load_conf_history(storage)
        self.tracker = Tracker(self.membership)
        self._msgs: list[tuple[str, Any]] = []
        self._read_states: list[ReadState] = []
        self._votes: dict[str, bool] = {}
        self._prev_hard = HardState(self.term, self.voted_for, self.log.committed)
        self._prev_soft = SoftState(None, Role.FOLLOWER.value)
        self._pending_conf_index = 0
        self._leader_contact = -math.inf
        self._lease = config.election_timeout_min
        self._hint: str | None = None  # the leader before a pre-vote, restored if it fails
        self._active_at = now
        self._election_deadline = now + self._random_timeout()
        self._heartbeat_due = self._quorum_check_due = math.inf
        self._learner_heartbeat_due = -math.inf
        self._read_seq = 0
        self._pending_reads: list[list[Any]] = []  # [request_id, index or None]

    # -- public state -----------------------------------------------------------------------
    @property
    def membership(self) -> Membership:
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
            self._tick_leader(now)
        elif now >= self._election_deadline:
            self._reset_election_timer()
            if self._promotable():
                self._campaign(pre_vote=True)

    def leader_lost(self, now: float, node: str) -> None:
        """The failure detector declared `node` dead (or gone): if it is our leader, drop its
        lease and campaign at our place among its successors (see succession.py). A leader
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
        self._leader_contact = -math.inf
        self._election_deadline = min(self._election_deadline, now + successor_delay(
            self.membership.voters, self.id, node, self.cfg.heartbeat_interval, self.cfg.election_timeout_min,
            self._rng.random()))

    def step(self, now: float, src: str, msg: Message) -> None:
        """Handle one message from peer src; raises InvalidMessage on absurd fields."""
        msg.validate()
        self._now = now
        if src == self.id or (isinstance(msg, _LEADER_MSGS) and msg.leader != src):
            return
        if isinstance(msg, VoteRequest) and msg.candidate != src:
            return
        if msg.term > self.term and not self._on_higher_term(src, msg):
            return
        if msg.term < self.term:
            self._on_lower_term(src, msg)
            return
        self._dispatch(src, msg)

    def propose(self, kind: EntryKind | str, payload: Mapping[str, Any]) -> ProposeResult:
        """Append an entry as leader; config changes go through change_membership."""
        if self.role is not Role.LEADER:
            return NotLeader(self.leader)
        try:
            kind = EntryKind(kind)
        except ValueError:
            return Refused(f"unknown entry kind {kind!r}")
        if kind is EntryKind.CONFIG_CHANGE:
            return Refused("use change_membership for configuration changes")
        if not payload_ok(kind, payload):
            return Refused(f"bad payload for {kind.value}")
        entry = self._leader_append(kind, dict(payload))
        return Proposed(entry.index, entry.term)

    def change_membership(self, op: ChangeOp | str, node: str) -> ProposeResult:
        """Propose one single-server change (add_learner, add_voter, promote, remove)."""
        if self.role is not Role.LEADER:
            return NotLeader(self.leader)
        if self._pending_conf_index > self.log.committed:
            return Refused("a configuration change is still pending")
        op = ChangeOp(op)
        try:
            new = self.membership.changed(op, node, self.cfg.max_voters)
        except MembershipError as exc:
            return Refused(str(exc))
        if op is ChangeOp.PROMOTE and self.tracker.progress[node].match < self.log.committed:
            return Refused(f"learner {node!r} has not caught up with the commit index yet")
        entry = self._leader_append(EntryKind.CONFIG_CHANGE, new.to_payload())
        self._pending_conf_index = entry.index
        return Proposed(entry.index, entry.term)

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

    def accept_committed(self, entries: Iterable[Entry], commit_index: int) -> AcceptResult:
        """Take entries committed elsewhere (fetched from any peer, commit_index being that
        peer's). The batch must start at or below our commit index so the entry before the
        first new one is checked (log matching); committed entries are never truncated."""
        batch = list(entries)
        if self.role is Role.LEADER or not batch:
            return AcceptResult(not batch, self.log.committed, "" if not batch else "leader")
        lo = self.log.committed
        problem = check_committed_batch(batch, commit_index, lo)
        if problem:
            return AcceptResult(False, lo, problem)
        for e in batch:
            if e.index <= lo and self.log.term(e.index) not in (None, e.term):
                return AcceptResult(False, lo, f"entry {e.index} conflicts with a committed entry")
        fresh = [e for e in batch if e.index > lo]
        conflict = self.log.find_conflict(fresh)
        if conflict:
            self._append(fresh[conflict - fresh[0].index:])
        if fresh:
            self.log.commit_to(fresh[-1].index)
        return AcceptResult(True, self.log.committed)

    def force_new_configuration(self, voters: Iterable[str]) -> None:
        """UNSAFE BY DESIGN, for operators who lost a majority of voters for good: append a
        config_change that shrinks the voters to the survivors and campaign under it. Entries
        committed by the lost majority but missing here may be lost; run it on the survivor
        with the most up-to-date log, on one node only."""
        new = Membership.of(voters, self.membership.learners - set(voters))
        if self.id not in new.voters:
            raise MembershipError("force_new_configuration must keep this node a voter")
        log.warning("FORCED reconfiguration by %s in term %d: voters %s -> %s (unsafe)",
                    self.id, self.term, sorted(self.membership.voters), sorted(new.voters))
        self._become_follower(self.term + 1, None)
        self._append([Entry(self.log.last_index() + 1, self.term, EntryKind.CONFIG_CHANGE,
                            new.to_payload())])
        self._campaign(pre_vote=False)

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
        self._prune_conf_history()
        if self.role is Role.LEADER and self.id in self.tracker.progress:
            self.tracker.progress[self.id].maybe_update(self.log.stable_index())
            if self._maybe_commit():
                self._broadcast_append()

    def _hard_state(self) -> HardState:
        return HardState(self.term, self.voted_for, self.log.committed)

    def _soft_state(self) -> SoftState:
        return SoftState(self.leader, self.role.value)

    # -- term handling and dispatch ---------------------------------------------------------
    def _on_higher_term(self, src: str, msg: Message) -> bool:
        """Adopt a higher term unless it is a (pre-)vote we must not let disrupt us."""
        if isinstance(msg, VoteRequest):
            if self._in_lease():
                self._send(src, VoteResponse(self.term, False, msg.pre_vote, "leader_lease"))
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
            self._send(src, AppendResponse(self.term, False, 0))
        elif isinstance(msg, VoteRequest) and msg.pre_vote:
            self._send(src, VoteResponse(self.term, False, True, "stale_term"))

    def _dispatch(self, src: str, msg: Message) -> None:
        if isinstance(msg, VoteRequest):
            self._on_vote_request(src, msg)
        elif isinstance(msg, VoteResponse):
            self._on_vote_response(src, msg)
        elif isinstance(msg, _LEADER_MSGS):
            self._on_leader_message(src, msg)
        elif self.role is Role.LEADER and isinstance(msg, AppendResponse):
            self._on_append_response(src, msg)
        elif self.role is Role.LEADER and isinstance(msg, HeartbeatResponse):
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
        return self.id in self.membership.voters and self.log.pending_snapshot is None

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

    def _on_vote_request(self, src: str, m: VoteRequest) -> None:
        """Grant iff we may vote for src in m.term and its log is at least as up to date."""
        can_vote = (
            self.voted_for == src
            or (self.voted_for is None and self.leader is None)
            or (m.pre_vote and m.term > self.term)
        )
        if not can_vote:
            self._send(src, VoteResponse(self.term, False, m.pre_vote, "already_voted"))
        elif not self.log.is_up_to_date(m.last_index, m.last_term):
            self._send(src, VoteResponse(self.term, False, m.pre_vote, "log_behind"))
        else:
            if not m.pre_vote:
                self.voted_for = src
                self._reset_election_timer()
            self._send(src, VoteResponse(m.term, True, m.pre_vote))

    def _on_vote_response(self, src: str, m: VoteResponse) -> None:
        pre = self.role is Role.PRE_CANDIDATE
        if self.role not in (Role.PRE_CANDIDATE, Role.CANDIDATE) or m.pre_vote != pre:
            return
        if m.granted and m.term != self.term + (1 if pre else 0):
            return
        if src in self.membership.voters:
            self._votes.setdefault(src, m.granted)
            self._tally()

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
        self.tracker.progress = {}
        self.tracker.reset(self.membership, self.log.last_index())
        for pr in self.tracker.progress.values():
            pr.recent_active = True
        if self.id in self.tracker.progress:
            self.tracker.progress[self.id].maybe_update(self.log.stable_index())
        self._heartbeat_due = self._now + self.cfg.heartbeat_interval
        self._learner_heartbeat_due = self._now + self.cfg.learner_heartbeat_interval
        self._quorum_check_due = self._now + self.cfg.election_timeout_min
        self._leader_append(EntryKind.NOOP, {})
        self._pending_conf_index = self.log.last_index()

    # -- follower side ----------------------------------------------------------------------
    def _on_leader_message(self, src: str, m: AppendRequest | Heartbeat | SnapshotRequest) -> None:
        if self.role is Role.LEADER:
            return
        if self.role is not Role.FOLLOWER or self.leader != src:
            self._become_follower(self.term, src)
        idle = isinstance(m, Heartbeat) and m.idle and self.cfg.idle_heartbeat_interval > 0
        self._leader_contact = self._now
        self._lease = self.cfg.idle_election_timeout if idle else self.cfg.election_timeout_min
        self._reset_election_timer(idle)
        if isinstance(m, AppendRequest):
            self._on_append(src, m)
        elif isinstance(m, Heartbeat):
            self.log.commit_to(m.commit)
            self._send(src, HeartbeatResponse(self.term, m.read_seq))
        else:
            self._on_snapshot(src, m)

    def _on_append(self, src: str, m: AppendRequest) -> None:
        """Log matching: accept after (prev_index, prev_term) or reject with a backoff hint."""
        if m.prev_index < self.log.committed:
            self._send(src, AppendResponse(self.term, True, self.log.committed))
            return
        if not self.log.match_term(m.prev_index, m.prev_term):
            hint, hint_term = self.log.find_conflict_by_term(m.prev_index, m.prev_term)
            self._send(src, AppendResponse(self.term, False, m.prev_index, hint, hint_term))
            return
        conflict = self.log.find_conflict(m.entries)
        if conflict:
            self._append(m.entries[conflict - m.entries[0].index:])
        last_new = m.prev_index + len(m.entries)
        self.log.commit_to(min(m.commit, last_new))
        self._send(src, AppendResponse(self.term, True, last_new))

    def _on_snapshot(self, src: str, m: SnapshotRequest) -> None:
        if m.index <= self.log.committed:
            self._send(src, AppendResponse(self.term, True, self.log.committed))
            return
        if self.log.match_term(m.index, m.term_of_index):
            self.log.commit_to(m.index)
        else:
            self.log.restore(Snapshot(m.index, m.term_of_index, m.data, m.membership))
            self._conf_history = [(m.index, m.membership)]
        self._send(src, AppendResponse(self.term, True, self.log.committed))

    # -- plumbing ---------------------------------------------------------------------------
    def _send(self, dst: str, msg: Any) -> None:
        self._msgs.append((dst, msg))

    def _append(self, entries: list[Entry]) -> None:
        """Append to the log and follow any configuration it adds or truncates away."""
        start = entries[0].index
        self.log.append(entries)
        before = self.membership
        self._conf_history = [c for c in self._conf_history if c[0] < start] or self._conf_history[:1]
        for e in entries:
            if e.kind is EntryKind.CONFIG_CHANGE:
                self._conf_history.append((e.index, Membership.from_payload(e.payload)))
        if self.membership != before and self.role is Role.LEADER:
            self.tracker.reset(self.membership, self.log.last_index())

    def _prune_conf_history(self) -> None:
        """Keep the last configuration at or below the commit index and every later one."""
        keep = [c for c in self._conf_history if c[0] <= self.log.committed][-1:]
        later = [c for c in self._conf_history if c[0] > self.log.committed]
        self._conf_history = (keep or self._conf_history[:1]) + later


def _load_conf_history(storage: Storage) -> list[tuple[int, Membership]]:
    """The snapshot's configuration followed by every config_change in the stored log."""
    snap = storage.snapshot()
    history = [(snap.index, snap.membership)]
    lo = max(storage.first_index, snap.index + 1)
    for e in storage.entries(lo, storage.last_index + 1) if lo <= storage.last_index else []:
        if e.kind is EntryKind.CONFIG_CHANGE:
            history.append((e.index, Membership.from_payload(e.payload)))
    return history
