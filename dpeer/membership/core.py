"""The pure SWIM + Lifeguard membership core (hashicorp/memberlist's protocol, etcd-raft style).

The caller passes `now`, an RNG and incoming messages; the core returns (address, message)
pairs to send and queues effects for the daemon. No clock, no sockets, no threads: the same
seed replays the same run, which is what the simulation tests rely on.
"""

from __future__ import annotations

import heapq
import random
from typing import Iterable

from dpeer.membership.awareness import Awareness
from dpeer.membership.broadcast import BroadcastQueue, retransmit_limit
from dpeer.membership.config import MembershipConfig
from dpeer.membership.dissemination import NEVER, Dissemination, Datagram, is_live, push_pull_scale
from dpeer.membership.effects import (
    Effect,
    HeartbeatObserved,
    MemberAlive,
    MemberDead,
    MemberLeft,
    MemberSuspect,
)
from dpeer.membership.probing import Probing, Timer, Probe, Relay
from dpeer.membership.refutation import Fanout, FanoutCap, refutation_targets
from dpeer.membership.messages import (
    Ack,
    Gossip,
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
from dpeer.membership.state import LIVE, MemberRow, MemberTable, ProbeOrder
from dpeer.membership.suspicion import Suspicion, suspicion_timeout

ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT


class Membership(Dissemination, Probing):
    """One node's view of the cluster: probes, suspicion, refutation, gossip and anti-entropy."""

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
        self._rng = rng
        self._version = (0, 0, 0)
        self._table = MemberTable()
        self._queue = BroadcastQueue()
        self._awareness = Awareness(config.awareness_max_multiplier)
        self._effects: list[Effect] = []
        self._timers: list[tuple[float, int, Timer, object]] = []
        self._seq = 0
        self._probe: Probe | None = None
        self._relays: dict[int, Relay] = {}
        self._order = ProbeOrder(rng)
        self._fanout = FanoutCap(config.refused_suspicion_timeout)
        self._seeds: tuple[str, ...] = ()
        self._leaving = False
        self._next_probe = now + rng.uniform(0, config.probe_interval)
        self._next_gossip = now + rng.uniform(0, config.gossip_interval)
        self._next_reconnect = now + rng.uniform(0, config.reconnect_interval)
        for record in known:
            self._adopt(now, record)
        self._next_push_pull = now + rng.uniform(0, push_pull_scale(config.push_pull_interval, self.num_live))

    # -- the caller's API -----------------------------------------------------------------
    def set_local_version(self, term: int, last_applied: int, commit_index: int) -> None:
        """Set the version our heartbeats advertise (from the replicated log)."""
        self._version = (term, last_applied, commit_index)

    def join(self, now: float, seeds: Iterable[str]) -> list[Datagram]:
        """Start a full state exchange with each seed address; retried while we know nobody."""
        self._seeds = tuple(s for s in seeds if s != self.addr)
        self._queue.push(self._self_update())
        self._next_push_pull = now + 2 * self.config.probe_interval
        state = self._push_pull(now, join=True, reply=False)
        return [(seed, state) for seed in self._seeds]

    def leave(self, now: float) -> list[Datagram]:
        """Leave gracefully: stop probing and gossip our `left` state (keep ticking to spread it)."""
        self._leaving = True
        self._probe = None
        update = Update(LEFT, self.node_id, self.addr, self.incarnation, self.node_id)
        self._queue.push(update)
        peers = self._table.sample(self._rng, self.config.gossip_nodes, is_live)
        return [(m.addr, Gossip(self._hb(now), (update,))) for m in peers]

    def receive(self, now: float, msg: Message) -> list[Datagram]:
        """Handle one validated message; return what to send."""
        out: list[Datagram] = []
        self._observe(now, msg.hb, out)
        for update in getattr(msg, "updates", ()):
            self._apply(now, update, msg.hb.addr, out)
        if isinstance(msg, Ping):
            self._on_ping(now, msg, out)
        elif isinstance(msg, Ack):
            self._on_ack(now, msg, out)
        elif isinstance(msg, PingReq):
            self._on_ping_req(now, msg, out)
        elif isinstance(msg, Nack):
            self._on_nack(msg)
        elif isinstance(msg, PushPull):
            self._on_push_pull(now, msg, out)
        return out

    def unreachable(self, now: float, addr: str) -> list[Datagram]:
        """A connection to addr was refused: its process is gone, so suspect it with a short timer."""
        member = self._table.by_addr(addr)
        if member is None or member.state not in LIVE:
            return []
        out: list[Datagram] = []
        self._suspect(now, member.node_id, member.incarnation, self.node_id, True, None, out)
        if self._probe is not None and self._probe.target == member.node_id:
            self._probe = None
        return out

    def tick(self, now: float) -> list[Datagram]:
        """Run every timer due at `now`: probe timeouts, suspicions, probes, gossip, push-pull."""
        out: list[Datagram] = []
        while self._timers and self._timers[0][0] <= now:
            _, _, kind, key = heapq.heappop(self._timers)
            self._on_timer(now, kind, key, out)
        if now >= self._next_probe:
            self._probe_round(now, out)
        if now >= self._next_gossip and len(self._queue):
            self._next_gossip = now + self.config.gossip_interval
            self._gossip_round(now, out)
        if now >= self._next_push_pull:
            self._push_pull_round(now, out)
        if now >= self._next_reconnect:
            self._next_reconnect = now + self.config.reconnect_interval
            self._reconnect_round(now, out)
        return out

    def next_tick(self) -> float | None:
        """When tick() next has work (possibly early: a spurious tick is harmless).

        Timers that can no longer act (an acked probe's timeout, an answered relay) are dropped
        first, so a healthy node is not woken for them: most probes are acked well inside
        their timeout."""
        self._drop_stale_timers()
        gossip = self._next_gossip if len(self._queue) else NEVER
        soonest = min(self._next_probe, gossip, self._next_push_pull, self._next_reconnect)
        if self._timers:
            soonest = min(soonest, self._timers[0][0])
        return None if soonest == NEVER else soonest

    def drain_effects(self) -> list[Effect]:
        """Take the effects queued since the last call (state changes, heartbeats)."""
        effects, self._effects = self._effects, []
        return effects

    def members(self) -> list[MemberRecord]:
        """Every known member, ourselves included, as records (for status and bootstrap)."""
        return [self._self_record(), *(m.record() for m in self._table)]

    def member(self, node_id: str) -> MemberRecord | None:
        """One member's record, or None when unknown (or reaped)."""
        if node_id == self.node_id:
            return self._self_record()
        member = self._table.get(node_id)
        return None if member is None else member.record()

    def state_of(self, node_id: str) -> MemberState | None:
        """What we believe about node_id, in O(1)."""
        if node_id == self.node_id:
            return LEFT if self._leaving else ALIVE
        member = self._table.get(node_id)
        return None if member is None else member.state

    @property
    def num_live(self) -> int:
        """Alive and suspect members, ourselves included: our estimate of N."""
        return self._table.live + (not self._leaving)

    @property
    def health_score(self) -> int:
        """Lifeguard's local health score (0 is healthy)."""
        return self._awareness.score

    def _on_timer(self, now: float, kind: Timer, key: object, out: list[Datagram]) -> None:
        if kind is Timer.SUSPICION:
            self._suspicion_expired(now, str(key))
        elif kind is Timer.REFUTE_BROADCAST:
            self._fanout.release(now)
            if not self._leaving:  # a leaving node spreads its `left`, never an alive refutation
                self._broadcast_self(now, None, True, out)
        elif kind is Timer.RELAY:
            relay = self._relays.pop(key, None)  # type: ignore[call-overload]
            if relay is not None:
                out.append((relay.origin_addr, Nack(relay.origin_seq, self._hb(now))))
        elif self._probe is not None and self._probe.seq == key:
            if kind is Timer.PROBE_TIMEOUT:
                self._indirect_probe(now, self._probe, out)
            else:
                self._probe_failed(now, self._probe, out)

    # -- membership updates (memberlist's aliveNode / suspectNode / deadNode) ---------------
    def _observe(self, now: float, hb: Heartbeat, out: list[Datagram]) -> None:
        if hb.node_id == self.node_id:
            return
        member = self._table.get(hb.node_id)
        if member is None or hb.incarnation > member.incarnation:
            self._alive(now, hb.node_id, hb.addr, hb.incarnation)
            member = self._table.get(hb.node_id)
        if member is None or hb.incarnation < member.incarnation:
            return
        if member.state is SUSPECT or member.state is DEAD:
            out.append((hb.addr, Gossip(self._hb(now), (self._update_about(member),))))
        member.term, member.last_applied, member.commit_index = hb.term, hb.last_applied, hb.commit_index
        self._effects.append(HeartbeatObserved(hb, now))

    def _apply(self, now: float, update: Update, sender: str | None, out: list[Datagram]) -> None:
        if update.state is ALIVE:
            self._alive(now, update.node_id, update.addr, update.incarnation)
        elif update.state is SUSPECT:
            self._suspect(now, update.node_id, update.incarnation, update.origin, update.refused, sender, out)
        else:
            self._dead(now, update.node_id, update.incarnation, update.origin, update.state is LEFT, sender, out)

    def _alive(self, now: float, node_id: str, addr: str, incarnation: int) -> None:
        if node_id == self.node_id:
            if incarnation > self.incarnation and not self._leaving:
                self._refute(now, incarnation, None, False, [])
            return
        member = self._table.get(node_id)
        if member is None:
            self._add(now, MemberRow(node_id, addr, ALIVE, incarnation, now))
            return
        if incarnation <= member.incarnation:
            return
        member.incarnation = incarnation
        member.suspicion = None
        if addr != member.addr:
            self._table.set_addr(member, addr)
        if member.state is not ALIVE:
            self._table.set_state(member, ALIVE, now)
            self._effects.append(MemberAlive(node_id, incarnation, addr))
        self._queue.push(self._update_about(member))

    def _suspect(
        self,
        now: float,
        node_id: str,
        incarnation: int,
        origin: str,
        refused: bool,
        sender: str | None,
        out: list[Datagram],
    ) -> None:
        if self._about_me(now, node_id, incarnation, sender, refused, out):
            return
        member = self._table.get(node_id)
        if member is None or incarnation < member.incarnation or member.state not in LIVE:
            return
        here = refused and sender is None  # our own connection was refused (gossip, even an echo of ours, is not)
        if member.state is SUSPECT and member.suspicion is not None:
            self._confirm(now, member, origin, refused, here)
            return
        member.incarnation = incarnation
        self._table.set_state(member, SUSPECT, now)
        member.suspicion = self._new_suspicion(now, origin, refused)
        member.suspicion.refused_here = here
        self._timer(member.suspicion.deadline, Timer.SUSPICION, node_id)
        self._effects.append(MemberSuspect(node_id, incarnation, here))
        update = Update(SUSPECT, node_id, member.addr, incarnation, origin, refused)
        self._queue.push(update)
        if origin == self.node_id:
            # tell the suspect itself: a live one refutes at once (a reset can come from a live peer,
            # and the refused timer is too short to wait for gossip); a dead one refuses at no cost
            out.append((member.addr, Gossip(self._hb(now), (update,))))

    def _about_me(self, now: float, node_id: str, incarnation: int, sender: str | None, refused: bool,
                  out: list[Datagram]) -> bool:
        """True when a suspect, dead or left rumour is about this node, which refutes it (unless leaving)."""
        if node_id != self.node_id:
            return False
        if incarnation >= self.incarnation and not self._leaving:
            self._refute(now, incarnation, sender, refused, out)
        return True

    def _new_suspicion(self, now: float, origin: str, refused: bool) -> Suspicion:
        if refused:
            timeout = self.config.refused_suspicion_timeout
            return Suspicion(origin, now, 0, timeout, timeout, True)
        n = self.num_live
        k = self.config.suspicion_confirmations if n - 2 >= self.config.suspicion_confirmations else 0
        low = suspicion_timeout(self.config.suspicion_mult, n, self.config.probe_interval)
        return Suspicion(origin, now, k, low, low * self.config.suspicion_max_timeout_mult, False)

    def _confirm(self, now: float, member: MemberRow, origin: str, refused: bool, here: bool) -> None:
        suspicion = member.suspicion
        assert suspicion is not None
        changed = suspicion.confirm(origin)
        if refused:
            changed = suspicion.expedite(now, self.config.refused_suspicion_timeout) or changed
        if here and not suspicion.refused_here:
            # our own refusal backs a suspicion gossip brought first: say so once (see MemberSuspect)
            suspicion.refused_here = True
            self._effects.append(MemberSuspect(member.node_id, member.incarnation, True))
        if changed:
            self._timer(suspicion.deadline, Timer.SUSPICION, member.node_id)
            self._queue.push(Update(SUSPECT, member.node_id, member.addr, member.incarnation, origin, refused))

    def _suspicion_expired(self, now: float, node_id: str) -> None:
        member = self._table.get(node_id)
        if member is None or member.suspicion is None or now < member.suspicion.deadline:
            return
        self._dead(now, node_id, member.incarnation, self.node_id, False, None, [])

    def _dead(
        self,
        now: float,
        node_id: str,
        incarnation: int,
        origin: str,
        left: bool,
        sender: str | None,
        out: list[Datagram],
    ) -> None:
        if self._about_me(now, node_id, incarnation, sender, False, out):
            return
        member = self._table.get(node_id)
        state = LEFT if left else DEAD
        if member is None or incarnation < member.incarnation or member.state is LEFT or member.state is state:
            return
        member.incarnation = incarnation
        member.suspicion = None
        self._table.set_state(member, state, now)
        effect = MemberLeft if left else MemberDead
        self._effects.append(effect(node_id, incarnation))
        self._queue.push(Update(state, node_id, member.addr, incarnation, origin))

    def _refute(self, now: float, accused: int, sender: str | None, refused: bool, out: list[Datagram]) -> None:
        """Outbid an accusation with a higher incarnation, answering its sender. A refused one runs on
        the short refused timer, which gossip cannot outrun, so the refutation also goes straight to
        every live member, at most once per the fan-out cap's spacing (refutation.FanoutCap)."""
        self.incarnation = max(self.incarnation + 1, accused + 1)
        self._awareness.apply(1)
        self._queue.push(self._self_update())
        fanout = self._fanout.claim(now) if refused else None
        if fanout is Fanout.HOLD:
            self._timer(self._fanout.due, Timer.REFUTE_BROADCAST, None)
        self._broadcast_self(now, sender, fanout is Fanout.NOW, out)

    def _broadcast_self(self, now: float, sender: str | None, everyone: bool, out: list[Datagram]) -> None:
        """Send our current incarnation to the sender, and to every live member when ``everyone``."""
        live = {m.addr for m in self._table if m.state in LIVE} if everyone else set()
        gossip = Gossip(self._hb(now), (self._self_update(),))
        out.extend((a, gossip) for a in refutation_targets(live, sender, self.addr))

    def _add(self, now: float, member: MemberRow) -> None:
        self._table.add(member)
        self._order.insert(member.node_id)
        if member.state in LIVE:
            self._effects.append(MemberAlive(member.node_id, member.incarnation, member.addr))
            self._queue.push(self._update_about(member))

    def _adopt(self, now: float, record: MemberRecord) -> None:
        if record.node_id == self.node_id or self._table.get(record.node_id) is not None:
            return
        self._table.add(
            MemberRow(
                record.node_id, record.addr, record.state, record.incarnation, now,
                record.term, record.last_applied, record.commit_index,
            )
        )

    # -- small helpers --------------------------------------------------------------------
    def _piggyback(self) -> tuple[Update, ...]:
        if not len(self._queue):
            return ()
        limit = retransmit_limit(self.config.retransmit_mult, self.num_live)
        return self._queue.take(self.config.max_piggyback, limit)

    def _hb(self, now: float) -> Heartbeat:
        term, last_applied, commit_index = self._version
        return Heartbeat(self.node_id, self.addr, self.incarnation, term, last_applied, commit_index, now)

    def _self_update(self) -> Update:
        return Update(ALIVE, self.node_id, self.addr, self.incarnation, self.node_id)

    def _self_record(self) -> MemberRecord:
        term, last_applied, commit_index = self._version
        state = LEFT if self._leaving else ALIVE
        return MemberRecord(self.node_id, self.addr, state, self.incarnation, term, last_applied, commit_index)

    def _update_about(self, member: MemberRow) -> Update:
        return Update(member.state, member.node_id, member.addr, member.incarnation, self.node_id)
