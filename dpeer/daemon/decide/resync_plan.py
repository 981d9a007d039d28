"""Resync planning (pure, TorchFT-style): given our version and a peer's versioned heartbeat,
decide whether to fetch committed entries or nothing, and say why. A node behind the peer's
compaction point learns it from the fetch (the peer answers Behind) and gets the leader's
snapshot through Raft.

The tracker keeps one fetch in flight so a burst of heartbeats advertising what we are already
fetching does not start the same transfer again, and a failed fetch resumes from what was
actually applied rather than from where it started.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpeer.membership.messages import Heartbeat


@dataclass(frozen=True, slots=True)
class LocalVersion:
    """Our replicated-log position."""

    term: int
    last_applied: int
    commit_index: int


@dataclass(frozen=True, slots=True)
class Nothing:
    """No fetch: we are at or ahead, the peer cannot be trusted, or a fetch already covers it."""

    reason: str


@dataclass(frozen=True, slots=True)
class FetchEntries:
    """Fetch committed entries [from_index, to_index] from `peer` (streamed, chunked)."""

    peer: str
    from_index: int
    to_index: int
    reason: str


ResyncPlan = Nothing | FetchEntries


def plan_resync(local: LocalVersion, peer: Heartbeat, member: bool) -> ResyncPlan:
    """Decide what to pull from `peer`; only entries it has committed are ever fetched, and only
    from a member of the configuration in force (member: by node id and store uid)."""
    if not member:
        return Nothing(f"peer {peer.node_id} is not a member of the configuration in force here: not a source")
    if peer.term < local.term:
        return Nothing(f"peer {peer.node_id} term {peer.term} is below ours ({local.term}): cannot verify")
    if peer.commit_index <= local.last_applied:
        return Nothing(f"at or ahead of peer {peer.node_id} (applied {local.last_applied} >= {peer.commit_index})")
    return FetchEntries(
        peer.node_id, local.last_applied + 1, peer.commit_index,
        f"behind {peer.node_id}: applied {local.last_applied}, peer committed {peer.commit_index}",
    )


class ResyncTracker:
    """At most one fetch in flight; heartbeats it already covers start nothing new."""

    def __init__(self) -> None:
        self.in_flight: FetchEntries | None = None
        self._best: Heartbeat | None = None

    def observe(self, local: LocalVersion, peer: Heartbeat, member: bool) -> ResyncPlan:
        """Plan for a newly seen heartbeat, unless the fetch in flight covers it (no repeated propagation)."""
        if not member:
            return plan_resync(local, peer, member)
        if self.in_flight is not None:
            if peer.commit_index <= self.in_flight.to_index:
                return Nothing(f"covered by the fetch in flight from {self.in_flight.peer}")
            if self._best is None or peer.commit_index > self._best.commit_index:
                self._best = peer
            return Nothing(f"fetch from {self.in_flight.peer} in flight; will continue to {peer.commit_index}")
        plan = plan_resync(local, peer, member)
        if not isinstance(plan, Nothing):
            self.in_flight = plan
        return plan

    def finished(self, local: LocalVersion) -> ResyncPlan:
        """The fetch in flight ended, done or failed: plan the rest from what was actually applied.

        A failed fetch is not retried against the same peer here; the next heartbeat from any
        peer plans again from local.last_applied + 1 (resumable).
        """
        failed = self.in_flight.peer if self.in_flight is not None else None
        self.in_flight = None
        best, self._best = self._best, None
        if best is None:
            return Nothing(f"fetch from {failed} ended; no newer version known")
        return self.observe(local, best, True)
