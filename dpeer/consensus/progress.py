"""The leader's view of each follower: how far its log matches and what to send next.

States as in etcd: PROBE (one append per heartbeat until the match point is found), REPLICATE
(optimistic pipelining from next), SNAPSHOT (a snapshot is in flight; wait for its ack).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from dpeer.consensus.voting import VotingConfig


class ProgressState(StrEnum):
    """How the leader currently feeds a follower."""

    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


@dataclass
class Progress:
    """Replication state of one follower, kept by the leader only."""

    match: int = 0
    next: int = 1
    state: ProgressState = ProgressState.PROBE
    probe_sent: bool = False
    pending_snapshot: int = 0
    snapshot_sent_at: float = 0.0
    recent_active: bool = False
    heard_at: float = float("-inf")  # when the follower last answered this leader
    read_ack: int = 0

    def heard(self, now: float) -> None:
        """The follower answered at `now`: it counts as active for check-quorum and live for
        the strict reconfiguration check."""
        self.recent_active, self.heard_at = True, now

    def maybe_update(self, index: int) -> bool:
        """The follower matches up to index; True when match moved forward."""
        moved = index > self.match
        if moved:
            self.match = index
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        return moved

    def maybe_decrease(self, rejected: int, probe_prev: int) -> bool:
        """A rejection of prev_index `rejected`; False when it is stale (already superseded) or at
        or below the follower's match, where there is nothing to back off to (a disk that lost
        what it acknowledged): the next heartbeat's answer retries, not a storm of appends."""
        if rejected <= self.match:
            return False
        if self.state is ProgressState.REPLICATE:
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, probe_prev + 1), self.match + 1, 1)
        self.probe_sent = False
        return True

    def become_probe(self) -> None:
        """Search for the match point one append at a time."""
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self.state, self.probe_sent, self.pending_snapshot = ProgressState.PROBE, False, 0

    def become_replicate(self) -> None:
        """Stream entries optimistically from match + 1."""
        self.state, self.next, self.probe_sent = ProgressState.REPLICATE, self.match + 1, False

    def become_snapshot(self, index: int, now: float) -> None:
        """A snapshot at index was sent at now; pause appends until it is acknowledged."""
        self.state, self.pending_snapshot, self.snapshot_sent_at = ProgressState.SNAPSHOT, index, now
        self.probe_sent = False

    def is_paused(self) -> bool:
        """True when no append should be sent now."""
        return (self.state is ProgressState.PROBE and self.probe_sent) or (
            self.state is ProgressState.SNAPSHOT
        )


@dataclass
class Tracker:
    """Progress for every member of the current configuration, and quorum arithmetic."""

    membership: VotingConfig
    progress: dict[str, Progress] = field(default_factory=dict)

    def reset(self, membership: VotingConfig, last_index: int) -> None:
        """Follow a new configuration: keep known progress, start new members at last_index + 1."""
        self.membership = membership
        self.progress = {
            n: self.progress.get(n) or Progress(next=last_index + 1) for n in membership.members
        }

    def committed_index(self) -> int:
        """The highest index matched by a quorum of voters."""
        voters = self.membership.voters
        if not voters:
            return 0
        matches = sorted((self.progress[n].match for n in voters), reverse=True)
        return matches[self.membership.quorum - 1]

    def quorum_active(self, self_id: str) -> bool:
        """Did a quorum of voters (self included) respond since the last check?"""
        active = sum(1 for n in self.membership.voters
                     if n == self_id or self.progress[n].recent_active)
        return active >= self.membership.quorum

    def live(self, voters: list[str], self_id: str, since: float) -> list[str]:
        """The voters (of `voters`, self included) heard from at `since` or later."""
        return [n for n in voters if n == self_id or (n in self.progress and self.progress[n].heard_at >= since)]

    def read_confirmed(self, self_id: str, request_id: int) -> bool:
        """Has a quorum of voters acknowledged a heartbeat carrying request_id or later?"""
        acks = sum(1 for n in self.membership.voters
                   if n == self_id or self.progress[n].read_ack >= request_id)
        return acks >= self.membership.quorum
