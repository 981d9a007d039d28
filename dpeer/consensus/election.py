"""Election: terms, votes, pre-vote, the election timer and the leader's lease, for RaftNode.

It owns the election's state (votes of the campaign under way, the timer's deadline, when a
leader last reached us and for how long its lease holds, the leader the failure detector
declared lost) and moves RaftNode's term, vote, role and leader through Raft's rules.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from dpeer.consensus.messages import (
    LEADER_LEASE,
    AppendRequest,
    AppendResponse,
    Message,
    RaftHeartbeat,
    SnapshotRequest,
    VoteRequest,
    VoteResponse,
)
from dpeer.consensus.ready import Role
from dpeer.consensus.succession import LEASE_RETRY, successor_delay

if TYPE_CHECKING:
    from dpeer.consensus.core import RaftNode

LEADER_MSGS = (AppendRequest, RaftHeartbeat, SnapshotRequest)


class Election:
    """A node's elections. votes: the (pre-)votes of the campaign under way; hint: the leader
    known before a pre-vote, restored if it fails; lost, lost_at, lost_rounds: the leader that
    leader_lost() named, when, and the pre-vote rounds since (the lease retry's wait doubles per
    round); deadline: when the election timer fires; leader_contact and lease: when a leader's
    message last reached us and how long its lease runs from there; leader_seen_at: when a
    leader (or this node leading) was last known."""

    def __init__(self, node: RaftNode, rng: random.Random, now: float) -> None:
        self.node, self.rng = node, rng
        self.votes: dict[str, bool] = {}
        self.hint: str | None = None
        self.lost: str | None = None
        self.lost_at = -math.inf
        self.lost_rounds = 0
        self.leader_contact = -math.inf
        self.lease = node.cfg.election_timeout_min
        self.leader_seen_at = now
        self.deadline = now + self.random_timeout()

    # -- timers -------------------------------------------------------------------------------
    def random_timeout(self, idle: bool = False) -> float:
        """A fresh election timeout: the busy range, or the idle one after an idle beat."""
        cfg = self.node.cfg
        if idle:
            return self.rng.uniform(cfg.idle_election_timeout, 1.5 * cfg.idle_election_timeout)
        return self.rng.uniform(cfg.election_timeout_min, cfg.election_timeout_max)

    def reset_timer(self, idle: bool = False) -> None:
        """Restart the election timer from now."""
        self.deadline = self.node.now + self.random_timeout(idle)

    def tick(self, now: float) -> None:
        """Off the leader: when the timer fires, restart it and pre-campaign if we may."""
        if now >= self.deadline:
            self.reset_timer()
            if self.promotable():
                self.campaign(pre_vote=True)

    def heard_leader(self, idle: bool) -> None:
        """A leader's message reached us: its lease runs from now (longer after an idle beat)."""
        node = self.node
        self.leader_contact = self.leader_seen_at = node.now
        self.lease = node.cfg.idle_election_timeout if idle else node.cfg.election_timeout_min
        self.reset_timer(idle)

    def leader_lost(self, now: float, lost: str) -> None:
        """The failure detector declared our leader `lost`: drop its lease and campaign at our
        place among its successors (see succession.py)."""
        node = self.node
        if self.lost != lost or self.heard_since_lost():  # a verdict told again keeps its start
            self.lost, self.lost_at, self.lost_rounds = lost, now, 0
        self.leader_contact = -math.inf
        self.deadline = min(self.deadline, now + successor_delay(
            node.membership.voters, node.id, lost, node.cfg.election_timeout_min, self.rng.random()))

    def in_lease(self) -> bool:
        """Heard from a live leader within its lease (or we lead): election_timeout_min, or
        idle_election_timeout after an idle beat; leader_lost() ends it."""
        node = self.node
        if node.role is Role.LEADER:
            return True
        recent = node.now - self.leader_contact < self.lease
        return node.leader is not None and recent

    def promotable(self) -> bool:
        """A voter under its own store uid, with no snapshot pending, of the newest epoch known."""
        node = self.node
        return (node.membership.is_voter(node.id, node.uid) and node.log.pending_snapshot is None
                and not node.newest_epoch > node.epoch)

    # -- terms ----------------------------------------------------------------------------------
    def on_higher_term(self, src: str, msg: Message) -> bool:
        """Adopt a higher term unless it is a (pre-)vote we must not let disrupt us."""
        node = self.node
        if isinstance(msg, VoteRequest):
            if self.in_lease():
                node.out.reply(VoteResponse(node.term, False, msg.pre_vote, LEADER_LEASE))
                return False
            if not msg.pre_vote:
                self.follow(msg.term, None)
            return True
        if isinstance(msg, VoteResponse) and msg.pre_vote and msg.granted:
            return True
        self.follow(msg.term, src if isinstance(msg, LEADER_MSGS) else None)
        return True

    def on_lower_term(self, msg: Message) -> None:
        """Tell a stale leader or pre-candidate about our term; ignore everything else."""
        node = self.node
        if isinstance(msg, LEADER_MSGS):
            node.out.reply(AppendResponse(node.term, False, 0))
        elif isinstance(msg, VoteRequest) and msg.pre_vote:
            node.out.reply(VoteResponse(node.term, False, True, "stale_term"))

    def follow(self, term: int, leader: str | None) -> None:
        """Become a follower in term (a higher one forgets our vote), of leader if known."""
        node = self.node
        if term > node.term:
            node.term, node.voted_for = term, None
        self.hint = None
        node.role, node.leader, self.votes = Role.FOLLOWER, leader, {}
        node.lead.stop()
        node.reads.drop()
        self.reset_timer()

    # -- votes ----------------------------------------------------------------------------------
    def campaign(self, pre_vote: bool) -> None:
        """Ask every voter for a (pre-)vote; a pre-vote keeps our term unchanged."""
        node = self.node
        if pre_vote:
            self.hint = node.leader or self.hint
            node.role, node.leader = Role.PRE_CANDIDATE, None
            self.lost_rounds += 1
            vote_term = node.term + 1
        else:
            node.term, node.voted_for = node.term + 1, node.id
            node.role, node.leader, vote_term = Role.CANDIDATE, None, node.term
        self.votes = {node.id: True}
        self.reset_timer()
        req = VoteRequest(vote_term, node.id, node.log.last_index(), node.log.last_term(), pre_vote)
        for peer in sorted(node.membership.voters - {node.id}):
            node.out.send(peer, req)
        self.tally()

    def on_vote_request(self, src: str, m: VoteRequest, epoch: int) -> None:
        """Grant iff we may vote for src in m.term, src follows the newest epoch we know of, and
        its log is at least as up to date as ours (the candidate counts the vote only if its
        configuration names us with our uid)."""
        node = self.node
        can_vote = (
            node.voted_for == src
            or (node.voted_for is None and node.leader is None)
            or (m.pre_vote and m.term > node.term)
        )
        if epoch < node.newest_epoch:
            node.out.reply(VoteResponse(node.term, False, m.pre_vote, "old_epoch"))
        elif not can_vote:
            node.out.reply(VoteResponse(node.term, False, m.pre_vote, "already_voted"))
        elif not node.log.is_up_to_date(m.last_index, m.last_term):
            node.out.reply(VoteResponse(node.term, False, m.pre_vote, "log_behind"))
        else:
            if not m.pre_vote:
                node.voted_for = src
                self.reset_timer()
            node.out.reply(VoteResponse(m.term, True, m.pre_vote))

    def on_vote_response(self, src: str, m: VoteResponse) -> None:
        """Count a (pre-)vote for the campaign under way; a refusal from the leader we declared
        lost shows the verdict was wrong."""
        node = self.node
        if src == self.lost and not m.granted:
            self.lost = None  # the leader we declared lost answers: the verdict was wrong, no lease retries
            if node.role is Role.FOLLOWER:
                self.reset_timer()  # drop a retry armed before its answer came
        pre = node.role is Role.PRE_CANDIDATE
        if node.role not in (Role.PRE_CANDIDATE, Role.CANDIDATE) or m.pre_vote != pre:
            return
        if m.granted and m.term != node.term + (1 if pre else 0):
            return
        if src in node.membership.voters:
            # Pre-vote rounds share a term, so a refusal may be a late answer to an earlier round: a
            # grant replaces it (a grant is always sound to count; a real vote is granted once per term).
            if m.granted or src not in self.votes:
                self.votes[src] = m.granted
            self.tally()
            if pre and not m.granted and m.reason == LEADER_LEASE:
                self.retry_after_lease()

    def retry_after_lease(self) -> None:
        """A voter refused our pre-vote because it still holds the lost leader's lease: its own
        detector has not caught up yet (we campaign the moment ours did), so ask again soon, the
        wait doubling with each round (however many voters refused in it), until
        election_timeout_min after the verdict, when every such lease has run out anyway. Runs after
        the tally, so a refusal that lost the round re-arms the retry the fallback timer replaced."""
        cfg, now = self.node.cfg, self.node.now
        if self.heard_since_lost():
            self.lost = None
        wait = cfg.heartbeat_interval * LEASE_RETRY * 2 ** max(0, self.lost_rounds - 1)
        if self.lost is None or now + wait > self.lost_at + cfg.election_timeout_min:
            return
        self.deadline = min(self.deadline, now + wait)

    def heard_since_lost(self) -> bool:
        """A leader's message reached us after the verdict of leader_lost(): it no longer stands."""
        return self.leader_contact >= self.lost_at

    def tally(self) -> None:
        """Win (go on to the real vote after a pre-vote) with a quorum of grants; lose with a
        quorum of refusals."""
        node = self.node
        voters = node.membership.voters
        granted = sum(1 for n, ok in self.votes.items() if ok and n in voters)
        rejected = sum(1 for n, ok in self.votes.items() if not ok and n in voters)
        if granted >= node.membership.quorum:
            if node.role is Role.PRE_CANDIDATE:
                self.campaign(pre_vote=False)
            else:
                node.role, node.leader, self.votes = Role.LEADER, node.id, {}
                self.leader_seen_at = node.now
                node.lead.start()
        elif len(voters) - rejected < node.membership.quorum:
            # A lost pre-vote changed no term: the leader we knew is still the best guess.
            self.follow(node.term, self.hint if node.role is Role.PRE_CANDIDATE else None)
