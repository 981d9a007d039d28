"""Which boxes answer for each node id: when this node first and last heard each (node id, store
uid) pair and from where, each daemon start (boot) heard under that pair, and when gossip last
held each node id dead or gone.

Gossip keys members by node id alone, so two boxes under one id (a cloned disk image) look like
one member to it. Every message a peer sends carries its store uid, so these sightings tell the
holder of a node id's committed record from a box that claims the id (views.claim_verdict). A
full copy of a disk carries the store uid too; every message also carries the random boot its
daemon drew at start and how long ago that was, so two live processes under one node id and
store tell apart as well (views.copies).
Pure bookkeeping: the caller passes the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from dpeer.consensus.config import RaftConfig
from dpeer.consensus.identity import answer_window

# Store uids kept per node id (the least recently heard goes first): a holder and a claimant or two.
MAX_UIDS = 4
# Boots kept per (node id, store uid), likewise: a process, its restart, a copy of its disk.
MAX_BOOTS = 4


@dataclass(slots=True)
class Heard:
    """One daemon start heard under a (node id, store uid): when first and last (arrivals), the
    address it last spoke from, when it started (this node's clock: the earliest arrival less the
    age it told) and the greatest age it told (`up`)."""

    first: float
    last: float
    addr: str
    started: float
    up: float = 0.0

    @property
    def last_sent(self) -> float:
        """When it sent its newest message, on its own timeline: not made later by a backlog
        this node took in late (a pause), as the arrival would be."""
        return self.started + self.up


@dataclass(slots=True)
class Seen:
    """One store uid heard under a node id: when first and last, the address it last spoke from,
    and its boots."""

    first: float
    last: float
    addr: str
    boots: dict[str, Heard] = field(default_factory=dict)


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

    def of_member(self, voter: bool) -> float:
        """The window of a voter, or of any other member."""
        return self.voter if voter else self.other


class Sightings:
    """What node `owner` (store `uid`, boot `boot`, serving at `addr`) heard of the others'
    identities since `since`; see the module docstring. The owner's own boot counts as heard always."""

    def __init__(self, owner: str, now: float, uid: str = "", boot: str = "", addr: str = "") -> None:
        self.owner, self.since = owner, now
        self._own = (uid, boot, Heard(now, math.inf, addr, now, math.inf))
        self._seen: dict[str, dict[str, Seen]] = {}
        self._dead: dict[str, float] = {}

    def saw(self, node_id: str, uid: str, addr: str, now: float, boot: str = "", up: float | None = None) -> None:
        """A message (or a join) from node_id under store uid, sent from addr, arrived at `now`;
        boot: its daemon's boot ("" when it sent none), up: that daemon's age it told (None: unknown)."""
        uids = self._seen.setdefault(node_id, {})
        seen = uids.get(uid)
        if seen is None:
            if len(uids) >= MAX_UIDS:
                del uids[min(uids, key=lambda u: uids[u].last)]
            seen = uids[uid] = Seen(now, now, addr)
        seen.last, seen.addr = max(seen.last, now), addr
        if boot:
            _saw_boot(seen.boots, boot, addr, now, up)

    def declared_dead(self, node_id: str, now: float) -> None:
        """Gossip declared node_id dead (or gone) at `now`."""
        self._dead[node_id] = now

    def seen(self, node_id: str, uid: str) -> Seen | None:
        """When node_id was heard under uid, or None when never (since `since`)."""
        return self._seen.get(node_id, {}).get(uid)

    def uids(self, node_id: str) -> Mapping[str, Seen]:
        """Every store uid node_id was heard under (at most MAX_UIDS, the most recent)."""
        return self._seen.get(node_id, {})

    def boots(self, node_id: str, uid: str) -> dict[str, Heard]:
        """Every boot heard under (node_id, uid) (at most MAX_BOOTS, the most recent), the owner's
        own boot included (heard always) when that pair is the owner's."""
        seen = self._seen.get(node_id, {}).get(uid)
        boots = dict(seen.boots) if seen is not None else {}
        own_uid, own_boot, own = self._own
        if node_id == self.owner and uid == own_uid and own_boot:
            boots[own_boot] = own
        return boots

    def dead_at(self, node_id: str) -> float | None:
        """When gossip last declared node_id dead or gone, or None when never (since `since`)."""
        return self._dead.get(node_id)


def _saw_boot(boots: dict[str, Heard], boot: str, addr: str, now: float, up: float | None) -> None:
    """Note one boot heard at `now`; its start is the earliest the messages tell (a message
    delayed on the way makes a later estimate), or its first sighting when none told its age."""
    heard = boots.get(boot)
    if heard is None:
        if len(boots) >= MAX_BOOTS:
            del boots[min(boots, key=lambda b: boots[b].last)]
        heard = boots[boot] = Heard(now, now, addr, now)
    heard.last, heard.addr = max(heard.last, now), addr
    told = up if up is not None else now - heard.started
    heard.started = min(heard.started, now - told)
    heard.up = max(heard.up, told)


@dataclass(frozen=True)
class Copy:
    """Two live processes under one node id and store (a copy of a disk): the one started first
    (`older`) and the one started after it (`newer`, the copy to stop), each as (boot, Heard)."""

    node_id: str
    uid: str
    older: tuple[str, Heard]
    newer: tuple[str, Heard]

    def sentence(self) -> str:
        """What the newer process is told, and every message of it refused with."""
        return held_by_another(self.node_id, self.uid, self.older[1].addr, self.older[0])

    def describe(self, now: float) -> str:
        """One line for the logs: both boots, where each last spoke from, how long each has run."""
        (old, o), (new, n) = self.older, self.newer
        return (f"node id {self.node_id} and its store {self.uid[:8]} are held by two live processes: boot {old[:8]} "
                f"at {o.addr} (up {now - o.started:.0f}s) and boot {new[:8]} at {n.addr} (up {now - n.started:.0f}s), "
                "a copy of its disk")


def held_by_another(node_id: str, uid: str, addr: str, boot: str) -> str:
    """The refusal of a process whose node id and store another live process (started before it) holds."""
    return (f"node id {node_id} and its store {uid[:8]} are held by another live process at {addr} (boot "
            f"{boot[:8]}, started before this one); this box runs a copy of its disk: give it a fresh data dir and "
            "another --node-id")


def copies(heard: Sightings, node_id: str, uid: str, window: float, now: float) -> list[Copy]:
    """Each boot under (node_id, uid) that started after another one that sent a message since it
    started, both heard within `window`: two processes under one id and store, the newer a copy.
    A restart is none: its old process sent its last message before the new one started."""
    live = sorted(((b, h) for b, h in heard.boots(node_id, uid).items() if now - h.last <= window),
                  key=lambda bh: (bh[1].started, bh[0]))
    found = []
    for i, (boot, h) in enumerate(live):
        older = [(b, o) for b, o in live[:i] if o.last_sent > h.started]
        if older:
            found.append(Copy(node_id, uid, older[0], (boot, h)))
    return found


def copy_of(heard: Sightings, node_id: str, uid: str, boot: str, window: float, now: float) -> Copy | None:
    """The Copy whose newer process is `boot`, or None when that boot is no copy (or not known)."""
    return next((c for c in copies(heard, node_id, uid, window, now) if c.newer[0] == boot), None)


def held_twice(heard: Sightings, voters: Iterable[str], uids: Mapping[str, str], window: float,
               now: float) -> dict[str, Copy]:
    """The voters whose configured store two live processes answer for (a copied disk), with the pair."""
    found = {v: copies(heard, v, uids.get(v, ""), window, now) for v in voters}
    return {v: c[0] for v, c in found.items() if c}
