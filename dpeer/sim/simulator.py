"""A seeded discrete-event simulator: many pure protocol cores in one process on a virtual clock.

Each node is an `Actor` (a thin adapter over a pure core). The simulator owns time, the
network, crashes, restarts and pauses; it calls `check` after every event so an invariant
violation is caught at the event that caused it, and the same seed replays the same run.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Protocol, runtime_checkable

from dpeer.sim.network import SimNetwork

Outbox = list[tuple[str, Any]]


class Actor(Protocol):
    """What the simulator drives: a node's pure core behind receive/tick."""

    def receive(self, now: float, src: str, msg: Any) -> Outbox:
        """Handle one message; return (destination, message) pairs to send."""

    def tick(self, now: float) -> Outbox:
        """Run timers due at `now`; return messages to send."""

    def next_tick(self) -> float | None:
        """The virtual time the actor next wants tick() called, or None for never."""


@runtime_checkable
class Refusing(Protocol):
    """Optional: actors that learn a destination refused a connection (its process is gone)."""

    def unreachable(self, now: float, dst: str) -> Outbox:
        """Called when a message to dst found no process there."""


@dataclass
class NodeSlot:
    """The simulator's record of one node: its actor and process state."""

    actor: Actor
    up: bool = True
    paused: bool = False
    epoch: int = 0
    tick_at: float | None = None
    held: list[tuple[str, Any]] = field(default_factory=list)


class _Event(Enum):
    """What a queued event does."""

    CALL = "call"  # run a scheduled function (a fault, a proposal)
    TICK = "tick"  # a node's timers are due
    DELIVER = "deliver"  # a message reaches its destination
    REFUSED = "refused"  # a sender learns its destination has no process


@dataclass
class SimStats:
    """Counters over a run."""

    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    bytes_sent: int = 0
    events: int = 0
    sent_by: dict[str, int] = field(default_factory=dict)


class Simulator:
    """Runs actors on a virtual clock with a seeded network; every choice comes from `seed`."""

    def __init__(
        self,
        seed: int,
        network: SimNetwork | None = None,
        size_of: Callable[[Any], int] | None = None,
        refused_delay: float = 0.001,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.network = network or SimNetwork(random.Random(seed ^ 0x5EED))
        self.now = 0.0
        self.nodes: dict[str, NodeSlot] = {}
        self.stats = SimStats()
        self._size_of = size_of
        self._refused_delay = refused_delay
        self._queue: list[tuple[float, int, _Event, tuple]] = []
        self._seq = 0

    # -- nodes -------------------------------------------------------------------------
    def add(self, node_id: str, actor: Actor) -> None:
        """Start a node running `actor`."""
        self.nodes[node_id] = NodeSlot(actor=actor)
        self._reschedule(node_id)

    def actor(self, node_id: str) -> Any:
        """The actor of a node (also while it is down: its last state)."""
        return self.nodes[node_id].actor

    def live(self) -> list[str]:
        """Nodes that are up and not paused."""
        return [n for n, s in self.nodes.items() if s.up and not s.paused]

    def crash(self, node_id: str) -> None:
        """Kill a node: its timers stop, messages to it are dropped and senders are refused."""
        slot = self.nodes[node_id]
        slot.up, slot.paused, slot.held = False, False, []
        slot.epoch += 1
        slot.tick_at = None

    def restart(self, node_id: str, actor: Actor) -> None:
        """Bring a crashed node back with a new actor (built from its durable state)."""
        slot = self.nodes[node_id]
        slot.actor, slot.up, slot.paused = actor, True, False
        slot.epoch += 1
        slot.tick_at = None
        self._reschedule(node_id)

    def pause(self, node_id: str) -> None:
        """Freeze a node (SIGSTOP): no timers run; messages to it wait in its socket buffer."""
        self.nodes[node_id].paused = True

    def resume(self, node_id: str) -> None:
        """Unfreeze a node (SIGCONT): held messages are delivered, then timers catch up."""
        slot = self.nodes[node_id]
        slot.paused = False
        held, slot.held = slot.held, []
        for src, msg in held:
            self._push(self.now, _Event.DELIVER, (node_id, src, msg, slot.epoch))
        slot.tick_at = None
        self._reschedule(node_id)

    def emit(self, node_id: str, out: Outbox) -> None:
        """Send what a node produced outside an event (a client proposal made through at())."""
        self._send_all(node_id, out)
        self._reschedule(node_id)

    # -- time --------------------------------------------------------------------------
    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Run fn (a fault, a proposal, a probe) at virtual time `when`."""
        self._push(when, _Event.CALL, (fn,))

    def run_until(self, until: float, check: Callable[["Simulator"], None] | None = None) -> None:
        """Process events up to virtual time `until`, calling check after each one."""
        while self._queue and self._queue[0][0] <= until:
            when, _, kind, data = heapq.heappop(self._queue)
            self.now = max(self.now, when)
            if self._dispatch(kind, data):
                self.stats.events += 1
                if check is not None:
                    check(self)
        self.now = max(self.now, until)

    def run_for(self, duration: float, check: Callable[["Simulator"], None] | None = None) -> None:
        """Process events for `duration` virtual seconds from now."""
        self.run_until(self.now + duration, check)

    # -- internals ---------------------------------------------------------------------
    def _push(self, when: float, kind: _Event, data: tuple) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (when, self._seq, kind, data))

    def _dispatch(self, kind: _Event, data: tuple) -> bool:
        if kind is _Event.CALL:
            data[0]()
            return True
        if kind is _Event.TICK:
            return self._on_tick(*data)
        if kind is _Event.DELIVER:
            return self._on_deliver(*data)
        return self._on_refused(*data)

    def _on_tick(self, node_id: str, epoch: int, when: float) -> bool:
        slot = self.nodes[node_id]
        if not slot.up or slot.paused or slot.epoch != epoch or slot.tick_at != when:
            return False
        slot.tick_at = None
        self._send_all(node_id, slot.actor.tick(self.now))
        self._reschedule(node_id)
        return True

    def _on_deliver(self, dst: str, src: str, msg: Any, epoch: int) -> bool:
        slot = self.nodes.get(dst)
        if slot is None or not slot.up or slot.epoch != epoch:
            self.stats.dropped += 1
            return False
        if slot.paused:
            slot.held.append((src, msg))
            return False
        self.stats.delivered += 1
        self._send_all(dst, slot.actor.receive(self.now, src, msg))
        self._reschedule(dst)
        return True

    def _on_refused(self, src: str, dst: str, epoch: int) -> bool:
        slot = self.nodes[src]
        if not slot.up or slot.paused or slot.epoch != epoch:
            return False
        if not isinstance(slot.actor, Refusing):
            return False
        self._send_all(src, slot.actor.unreachable(self.now, dst))
        self._reschedule(src)
        return True

    def _send_all(self, src: str, out: Outbox) -> None:
        for dst, msg in out:
            self._send(src, dst, msg)

    def _send(self, src: str, dst: str, msg: Any) -> None:
        self.stats.sent += 1
        self.stats.sent_by[src] = self.stats.sent_by.get(src, 0) + 1
        if self._size_of is not None:
            self.stats.bytes_sent += self._size_of(msg)
        target = self.nodes.get(dst)
        delay = self.network.route(src, dst)
        if delay is None:
            self.stats.dropped += 1
            return
        if target is None or not target.up:
            self.stats.dropped += 1
            self._push(self.now + self._refused_delay, _Event.REFUSED, (src, dst, self.nodes[src].epoch))
            return
        self._push(self.now + delay, _Event.DELIVER, (dst, src, msg, target.epoch))

    def _reschedule(self, node_id: str) -> None:
        slot = self.nodes[node_id]
        if not slot.up or slot.paused:
            return
        want = slot.actor.next_tick()
        if want is None:
            return
        want = max(want, self.now)
        if slot.tick_at is not None and slot.tick_at <= want:
            return
        slot.tick_at = want
        self._push(want, _Event.TICK, (node_id, slot.epoch, want))
