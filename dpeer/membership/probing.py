"""SWIM's failure detector for core.Membership: one direct probe per round, indirect probes
through k relays when its ack is late, the pings we relay for others, and Lifeguard's local
health awareness that slows our probing down when our own acks go missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpeer.membership.awareness import Awareness
from dpeer.membership.messages import Ack, Datagram, MemberState, Nack, Ping, PingReq
from dpeer.membership.table import LIVE
from dpeer.membership.timers import NEVER, Timer

if TYPE_CHECKING:
    from dpeer.membership.core import Membership

ALIVE, SUSPECT = MemberState.ALIVE, MemberState.SUSPECT


@dataclass(slots=True)
class Probe:
    """Our probe under way: its seq, its target, and what came back so far."""

    seq: int
    target: str
    acked: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclass(slots=True)
class Relay:
    """A ping we sent on another member's behalf (a ping-req), to answer with its ack or a nack."""

    origin_addr: str
    origin_seq: int


class Prober:
    """Probe rounds and relays. probe: the probe under way, if any; relays: the pings we relay,
    by our seq; next_round: when the next round starts (NEVER once leaving); awareness: our
    health score, which stretches the round and the probe timeout."""

    def __init__(self, node: Membership, now: float) -> None:
        self.node = node
        self.awareness = Awareness(node.config.awareness_max_multiplier)
        self.probe: Probe | None = None
        self.relays: dict[int, Relay] = {}
        self.next_round = now + node.rng.uniform(0, node.config.probe_interval)

    def round(self, now: float, out: list[Datagram]) -> None:
        """Ping the next member in the probe order, with timers for its ack and the round's end."""
        node, config = self.node, self.node.config
        if node.leaving:
            self.next_round = NEVER
            return
        self.next_round = now + self.awareness.scale(config.probe_interval)
        target = node.roster.order.next(node.roster.table, now, config.reap_after)
        if target is None:
            return
        seq = node.timers.next_seq()
        self.probe = Probe(seq, target.node_id)
        updates = node.dissemination.piggyback()
        if target.state is SUSPECT:
            updates = (node.roster.update_about(target), *updates[: config.max_piggyback - 1])
        out.append((target.addr, Ping(seq, target.node_id, node.heartbeat(now), updates)))
        timeout = min(self.awareness.scale(config.probe_timeout), self.next_round - now)
        node.timers.set(now + timeout, Timer.PROBE_TIMEOUT, seq)
        node.timers.set(self.next_round, Timer.PROBE_DEADLINE, seq)

    def stop(self, target: str | None = None) -> None:
        """Abandon the probe under way (only one of `target`, when given): we leave, or the
        target is already suspected."""
        if self.probe is not None and target in (None, self.probe.target):
            self.probe = None

    def stale(self, kind: Timer, key: object) -> bool:
        """True when a timer's firing would do nothing (see on_timer)."""
        if kind is Timer.RELAY:
            return key not in self.relays
        if kind in (Timer.PROBE_TIMEOUT, Timer.PROBE_DEADLINE):
            probe = self.probe
            return probe is None or probe.seq != key or probe.acked
        return False

    def on_timer(self, now: float, kind: Timer, key: object, out: list[Datagram]) -> None:
        """A relay, probe-timeout or probe-deadline timer fired."""
        if kind is Timer.RELAY:
            relay = self.relays.pop(key, None)  # type: ignore[call-overload]
            if relay is not None:
                out.append((relay.origin_addr, Nack(relay.origin_seq, self.node.heartbeat(now))))
        elif self.probe is not None and self.probe.seq == key:
            if kind is Timer.PROBE_TIMEOUT:
                self._indirect_probe(now, self.probe, out)
            else:
                self._probe_failed(now, self.probe, out)

    def on_ping(self, now: float, msg: Ping, out: list[Datagram]) -> None:
        """Ack a ping meant for us."""
        if msg.target == self.node.node_id:
            out.append((msg.hb.addr, Ack(msg.seq, self.node.heartbeat(now), self.node.dissemination.piggyback())))

    def on_ack(self, now: float, msg: Ack, out: list[Datagram]) -> None:
        """An ack of our probe (we are healthier), or of a ping we relay (pass it on)."""
        probe = self.probe
        if probe is not None and probe.seq == msg.seq and probe.target == msg.hb.node_id:
            if not probe.acked:
                probe.acked = True
                self.awareness.apply(-1)
            return
        relay = self.relays.pop(msg.seq, None)
        if relay is not None:
            out.append((relay.origin_addr, Ack(relay.origin_seq, msg.hb, self.node.dissemination.piggyback())))

    def on_ping_req(self, now: float, msg: PingReq, out: list[Datagram]) -> None:
        """Probe a target on another member's behalf."""
        node = self.node
        seq = node.timers.next_seq()
        self.relays[seq] = Relay(msg.hb.addr, msg.seq)
        out.append((msg.target_addr, Ping(seq, msg.target, node.heartbeat(now), node.dissemination.piggyback())))
        node.timers.set(now + node.config.probe_timeout, Timer.RELAY, seq)

    def on_nack(self, msg: Nack) -> None:
        """A relay reached us but not our target: count it (Lifeguard blames the target, not us)."""
        if self.probe is not None and self.probe.seq == msg.seq:
            self.probe.nacks += 1

    def _indirect_probe(self, now: float, probe: Probe, out: list[Datagram]) -> None:
        node = self.node
        target = node.roster.table.get(probe.target)
        if probe.acked or target is None or target.state not in LIVE:
            return
        relays = node.roster.table.sample(
            node.rng, node.config.indirect_checks, lambda m: m.state is ALIVE and m.node_id != probe.target
        )
        probe.expected_nacks = len(relays)
        hb = node.heartbeat(now)
        for relay in relays:
            out.append((relay.addr, PingReq(probe.seq, target.node_id, target.addr, hb, node.dissemination.piggyback())))

    def _probe_failed(self, now: float, probe: Probe, out: list[Datagram]) -> None:
        self.probe = None
        if probe.acked:
            return
        missed = probe.expected_nacks - probe.nacks if probe.expected_nacks else 1
        self.awareness.apply(missed)
        node = self.node
        target = node.roster.table.get(probe.target)
        if target is not None and target.state in LIVE:
            node.roster.suspect(now, target.node_id, target.incarnation, node.node_id, False, None, out)
