"""The pure SWIM + Lifeguard membership core (hashicorp/memberlist's protocol, etcd-raft style).

The caller passes `now`, an RNG and incoming messages; the core returns (address, message)
pairs to send and queues effects for the daemon. No clock, no sockets, no threads: the same
seed replays the same run, which is what the simulation tests rely on.
"""

from __future__ import annotations

import random
from typing import Iterable

from dpeer.membership.config import MembershipConfig
from dpeer.membership.dissemination import Dissemination
from dpeer.membership.effects import Effect
from dpeer.membership.messages import (
    Ack,
    Datagram,
    Heartbeat,
    MemberRecord,
    MemberState,
    Message,
    Nack,
    Ping,
    PingReq,
    PushPull,
    Update,
)
from dpeer.membership.probing import Prober
from dpeer.membership.refutation import Refuter
from dpeer.membership.roster import Roster
from dpeer.membership.table import LIVE
from dpeer.membership.timers import NEVER, Timer, Timers

ALIVE, LEFT = MemberState.ALIVE, MemberState.LEFT


class Membership:
    """One node's view of the cluster: probes, suspicion, refutation, gossip and anti-entropy.

    It holds what every part reads (node_id, addr, config, rng, incarnation, the version our
    heartbeats advertise, whether we are leaving) and wires its parts: roster (the member table
    and its merge rules, the effects queued for the daemon), refuter (claims about this node),
    prober (probe rounds, relays, local health), dissemination (piggybacked updates, gossip,
    push-pull, reconnect) and timers (the heap they all set, and the seq counter)."""

    def __init__(
        self,
        node_id: str,
        addr: str,
        config: MembershipConfig,
        rng: random.Random,
        now: float,
        incarnation: int = 0,
        known: Iterable[MemberRecord] = (),
    ) -> None:
        self.node_id = node_id
        self.addr = addr
        self.config = config
        self.incarnation = incarnation
        self.rng = rng
        self.version = (0, 0, 0)  # (term, last_applied, commit_index)
        self.leaving = False
        self.timers = Timers()
        self.roster = Roster(self)
        for record in known:
            self.roster.adopt(now, record)
        self.refuter = Refuter(self)
        # in this order, after the known members: each draws its first rounds' random offsets
        # from rng (the push-pull one scaled by num_live), which a seeded run replays
        self.prober = Prober(self, now)
        self.dissemination = Dissemination(self, now)

    # -- the caller's API -----------------------------------------------------------------
    def set_local_version(self, term: int, last_applied: int, commit_index: int) -> None:
        """Set the version our heartbeats advertise (from the replicated log)."""
        self.version = (term, last_applied, commit_index)

    def join(self, now: float, seeds: Iterable[str]) -> list[Datagram]:
        """Start a full state exchange with each seed address; retried while we know nobody."""
        return self.dissemination.join(now, tuple(s for s in seeds if s != self.addr))

    def leave(self, now: float) -> list[Datagram]:
        """Leave gracefully: stop probing and gossip our `left` state (keep ticking to spread it)."""
        self.leaving = True
        self.prober.stop()
        return self.dissemination.announce(now, Update(LEFT, self.node_id, self.addr, self.incarnation, self.node_id))

    def receive(self, now: float, msg: Message) -> list[Datagram]:
        """Handle one validated message; return what to send."""
        out: list[Datagram] = []
        self.roster.observe(now, msg.hb, out)
        for update in getattr(msg, "updates", ()):
            self.roster.apply(now, update, msg.hb.addr, out)
        if isinstance(msg, Ping):
            self.prober.on_ping(now, msg, out)
        elif isinstance(msg, Ack):
            self.prober.on_ack(now, msg, out)
        elif isinstance(msg, PingReq):
            self.prober.on_ping_req(now, msg, out)
        elif isinstance(msg, Nack):
            self.prober.on_nack(msg)
        elif isinstance(msg, PushPull):
            self.dissemination.on_push_pull(now, msg, out)
        return out

    def unreachable(self, now: float, addr: str) -> list[Datagram]:
        """A connection to addr was refused: its process is gone, so suspect it with a short timer."""
        member = self.roster.table.by_addr(addr)
        if member is None or member.state not in LIVE:
            return []
        out: list[Datagram] = []
        self.roster.suspect(now, member.node_id, member.incarnation, self.node_id, True, None, out)
        self.prober.stop(member.node_id)
        return out

    def tick(self, now: float) -> list[Datagram]:
        """Run every timer due at `now`: probe timeouts, suspicions, probes, gossip, push-pull."""
        out: list[Datagram] = []
        while (due := self.timers.pop_due(now)) is not None:
            self._on_timer(now, *due, out)
        if now >= self.prober.next_round:
            self.prober.round(now, out)
        self.dissemination.tick(now, out)
        return out

    def next_tick(self) -> float | None:
        """When tick() next has work (possibly early: a spurious tick is harmless).

        Timers that can no longer act (an acked probe's timeout, an answered relay) are dropped
        first, so a healthy node is not woken for them: most probes are acked well inside
        their timeout."""
        self.timers.drop_stale(self.prober.stale)
        soonest = min(self.prober.next_round, self.dissemination.next_due(), self.timers.next_due)
        return None if soonest == NEVER else soonest

    def drain_effects(self) -> list[Effect]:
        """Take the effects queued since the last call (state changes, heartbeats)."""
        return self.roster.drain_effects()

    def members(self) -> list[MemberRecord]:
        """Every known member, ourselves included, as records (for status and bootstrap)."""
        return [self.own_record(), *(m.record() for m in self.roster.table)]

    def member(self, node_id: str) -> MemberRecord | None:
        """One member's record, or None when unknown (or reaped)."""
        if node_id == self.node_id:
            return self.own_record()
        member = self.roster.table.get(node_id)
        return None if member is None else member.record()

    def state_of(self, node_id: str) -> MemberState | None:
        """What we believe about node_id, in O(1)."""
        if node_id == self.node_id:
            return LEFT if self.leaving else ALIVE
        member = self.roster.table.get(node_id)
        return None if member is None else member.state

    @property
    def num_live(self) -> int:
        """Alive and suspect members, ourselves included: our estimate of N."""
        return self.roster.table.live + (not self.leaving)

    @property
    def health_score(self) -> int:
        """Lifeguard's local health score (0 is healthy)."""
        return self.prober.awareness.score

    # -- what the parts read of this node ----------------------------------------------------
    def heartbeat(self, now: float) -> Heartbeat:
        """Our versioned heartbeat, as every message we send carries it."""
        term, last_applied, commit_index = self.version
        return Heartbeat(self.node_id, self.addr, self.incarnation, term, last_applied, commit_index, now)

    def own_update(self) -> Update:
        """Our alive claim at our current incarnation."""
        return Update(ALIVE, self.node_id, self.addr, self.incarnation, self.node_id)

    def own_record(self) -> MemberRecord:
        """Our own push-pull record (left once leaving)."""
        term, last_applied, commit_index = self.version
        state = LEFT if self.leaving else ALIVE
        return MemberRecord(self.node_id, self.addr, state, self.incarnation, term, last_applied, commit_index)

    def _on_timer(self, now: float, kind: Timer, key: object, out: list[Datagram]) -> None:
        if kind is Timer.SUSPICION:
            self.roster.suspicion_expired(now, str(key))
        elif kind is Timer.REFUTE_BROADCAST:
            self.refuter.release(now, out)
        else:
            self.prober.on_timer(now, kind, key, out)
