"""Probing half of the membership core: SWIM's direct and indirect probes, their timers and acks.

A mixin of core.Membership, split out so each file stays one concern; pure like the rest of
the core. The class declares what it uses of core.Membership, which sets or defines all of it.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from dpeer.membership.awareness import Awareness
from dpeer.membership.config import MembershipConfig
from dpeer.membership.dissemination import NEVER, Datagram
from dpeer.membership.messages import Ack, Heartbeat, MemberState, Nack, Ping, PingReq, Update
from dpeer.membership.state import LIVE, MemberRow, MemberTable, ProbeOrder

ALIVE, SUSPECT = MemberState.ALIVE, MemberState.SUSPECT


class Timer(Enum):
    """What a timer in the core's heap is for (its key: a probe or relay seq, or a node id)."""

    SUSPICION = "suspicion"
    RELAY = "relay"
    PROBE_TIMEOUT = "probe_timeout"  # no ack yet: ask others to probe indirectly
    PROBE_DEADLINE = "probe_deadline"  # the probe period ended: suspect an unacked target
    REFUTE_BROADCAST = "refute_broadcast"  # a refutation broadcast held back by the fan-out cap


@dataclass(slots=True)
class Probe:
    seq: int
    target: str
    acked: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclass(slots=True)
class Relay:
    origin_addr: str
    origin_seq: int


class Probing:
    """Probe rounds, indirect probes through relays, and the timer heap of core.Membership."""

    # The state core.Membership sets in __init__.
    config: MembershipConfig
    _rng: random.Random
    _table: MemberTable
    _order: ProbeOrder
    _awareness: Awareness
    _leaving: bool
    _next_probe: float
    _probe: Probe | None
    _relays: dict[int, Relay]
    _timers: list[tuple[float, int, Timer, object]]
    _seq: int

    # The operations core.Membership defines: our heartbeat, the updates to piggyback, a member's
    # own update, and the suspect rule.
    _hb: Callable[[float], Heartbeat]
    _piggyback: Callable[[], tuple[Update, ...]]
    _update_about: Callable[[MemberRow], Update]
    _suspect: Callable[[float, str, int, str, bool, str | None, list[Datagram]], None]

    def _probe_round(self, now: float, out: list[Datagram]) -> None:
        if self._leaving:
            self._next_probe = NEVER
            return
        self._next_probe = now + self._awareness.scale(self.config.probe_interval)
        target = self._order.next(self._table, now, self.config.reap_after)
        if target is None:
            return
        seq = self._next_seq()
        self._probe = Probe(seq, target.node_id)
        updates = self._piggyback()
        if target.state is SUSPECT:
            updates = (self._update_about(target), *updates[: self.config.max_piggyback - 1])
        out.append((target.addr, Ping(seq, target.node_id, self._hb(now), updates)))
        timeout = min(self._awareness.scale(self.config.probe_timeout), self._next_probe - now)
        self._timer(now + timeout, Timer.PROBE_TIMEOUT, seq)
        self._timer(self._next_probe, Timer.PROBE_DEADLINE, seq)

    def _drop_stale_timers(self) -> None:
        while self._timers and self._stale(self._timers[0][2], self._timers[0][3]):
            heapq.heappop(self._timers)

    def _stale(self, kind: Timer, key: object) -> bool:
        """True when the timer's firing would do nothing (see _on_timer)."""
        if kind is Timer.RELAY:
            return key not in self._relays
        if kind in (Timer.PROBE_TIMEOUT, Timer.PROBE_DEADLINE):
            probe = self._probe
            return probe is None or probe.seq != key or probe.acked
        return False

    def _indirect_probe(self, now: float, probe: Probe, out: list[Datagram]) -> None:
        target = self._table.get(probe.target)
        if probe.acked or target is None or target.state not in LIVE:
            return
        relays = self._table.sample(
            self._rng, self.config.indirect_checks, lambda m: m.state is ALIVE and m.node_id != probe.target
        )
        probe.expected_nacks = len(relays)
        hb = self._hb(now)
        for relay in relays:
            out.append((relay.addr, PingReq(probe.seq, target.node_id, target.addr, hb, self._piggyback())))

    def _probe_failed(self, now: float, probe: Probe, out: list[Datagram]) -> None:
        self._probe = None
        if probe.acked:
            return
        missed = probe.expected_nacks - probe.nacks if probe.expected_nacks else 1
        self._awareness.apply(missed)
        target = self._table.get(probe.target)
        if target is not None and target.state in LIVE:
            self._suspect(now, target.node_id, target.incarnation, self.node_id, False, None, out)

    def _on_ping(self, now: float, msg: Ping, out: list[Datagram]) -> None:
        if msg.target == self.node_id:
            out.append((msg.hb.addr, Ack(msg.seq, self._hb(now), self._piggyback())))

    def _on_ack(self, now: float, msg: Ack, out: list[Datagram]) -> None:
        probe = self._probe
        if probe is not None and probe.seq == msg.seq and probe.target == msg.hb.node_id:
            if not probe.acked:
                probe.acked = True
                self._awareness.apply(-1)
            return
        relay = self._relays.pop(msg.seq, None)
        if relay is not None:
            out.append((relay.origin_addr, Ack(relay.origin_seq, msg.hb, self._piggyback())))

    def _on_ping_req(self, now: float, msg: PingReq, out: list[Datagram]) -> None:
        seq = self._next_seq()
        self._relays[seq] = Relay(msg.hb.addr, msg.seq)
        out.append((msg.target_addr, Ping(seq, msg.target, self._hb(now), self._piggyback())))
        self._timer(now + self.config.probe_timeout, Timer.RELAY, seq)

    def _on_nack(self, msg: Nack) -> None:
        if self._probe is not None and self._probe.seq == msg.seq:
            self._probe.nacks += 1

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _timer(self, when: float, kind: Timer, key: object) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (when, self._seq, kind, key))
