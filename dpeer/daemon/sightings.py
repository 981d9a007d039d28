"""Which boxes answer for each node id: when this node first and last heard each (node id, store
uid) pair and from where, and when gossip last held each node id dead or gone.

Gossip keys members by node id alone, so two boxes under one id (a cloned disk image) look like
one member to it. Every message a peer sends carries its store uid, so these sightings tell the
holder of a node id's committed record from a box that claims the id (views.claim_verdict).
Pure bookkeeping: the caller passes the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from dpeer.consensus.config import RaftConfig
from dpeer.consensus.identity import answer_window

# Store uids kept per node id (the least recently heard goes first): a holder and a claimant or two.
MAX_UIDS = 4


@dataclass(slots=True)
class Seen:
    """One store uid heard under a node id: when first and last, and the address it last spoke from."""

    first: float
    last: float
    addr: str


@dataclass(frozen=True)
class Windows:
    """How long a live holder of a node id can go unheard by the leader: twice the slowest beat it
    answers (voters answer every voter beat, other members every learner beat)."""

    voter: float
    other: float

    @classmethod
    def of(cls, cfg: RaftConfig) -> Windows:
        """The windows of a Raft configuration's beats (idle ones included: they are the slowest)."""
        voter = answer_window(cfg)
        return cls(voter, max(voter, 2 * max(cfg.learner_heartbeat_interval, cfg.idle_learner_heartbeat_interval)))


class Sightings:
    """What node `owner` heard of the others' identities since `since`; see the module docstring."""

    def __init__(self, owner: str, now: float) -> None:
        self.owner, self.since = owner, now
        self._seen: dict[str, dict[str, Seen]] = {}
        self._dead: dict[str, float] = {}

    def saw(self, node_id: str, uid: str, addr: str, now: float) -> None:
        """A message (or a join) from node_id under store uid, sent from addr, arrived at `now`."""
        uids = self._seen.setdefault(node_id, {})
        seen = uids.get(uid)
        if seen is not None:
            seen.last, seen.addr = max(seen.last, now), addr
            return
        if len(uids) >= MAX_UIDS:
            del uids[min(uids, key=lambda u: uids[u].last)]
        uids[uid] = Seen(now, now, addr)

    def declared_dead(self, node_id: str, now: float) -> None:
        """Gossip declared node_id dead (or gone) at `now`."""
        self._dead[node_id] = now

    def seen(self, node_id: str, uid: str) -> Seen | None:
        """When node_id was heard under uid, or None when never (since `since`)."""
        return self._seen.get(node_id, {}).get(uid)

    def uids(self, node_id: str) -> Mapping[str, Seen]:
        """Every store uid node_id was heard under (at most MAX_UIDS, the most recent)."""
        return self._seen.get(node_id, {})

    def dead_at(self, node_id: str) -> float | None:
        """When gossip last declared node_id dead or gone, or None when never (since `since`)."""
        return self._dead.get(node_id)
