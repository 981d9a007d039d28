"""The node's loop: one timer for the cores' deadlines and the chores, slept on until the earliest.

The loop sleeps until the earliest deadline; an input wakes it only when it brought a deadline
forward (most messages do not), so an idle node wakes a few times per second. Chores run on a
short period while something changed lately (poke()) or the events say they are busy, else
every IDLE_CHORES.
"""

from __future__ import annotations

import asyncio
import math
from typing import Callable, Protocol

from dpeer.consensus import Role
from dpeer.daemon.node.events import NodeEvents

# How often chores run: the leader's decide views and membership (latency matters); the others'
# only watch their worker and their own membership record. Once nothing has changed for
# CHORES_BUSY_FOR seconds (no membership change, applied entry or role change; see poke()) and the
# events are not busy, chores run every IDLE_CHORES instead.
LEADER_CHORES, FOLLOWER_CHORES, IDLE_CHORES = 0.02, 0.1, 1.0
CHORES_BUSY_FOR = 1.0
# An input that moves the next deadline later by more than this re-arms the sleeping loop's
# alarm instead of letting it fire for nothing; smaller moves are not worth a new timer.
REARM_SLACK = 0.005
# asyncio runs a timer due within its clock resolution at once, without its clock moving; a
# deadline a hair away (a float's rounding) would then wake the loop for ever at the same time
TIMER_FLOOR = 1e-6


class Cores(Protocol):
    """What the loop drives: the cores' earliest deadline and their timers, and the node's role."""

    role: Role

    def due(self) -> float:
        """The cores' earliest deadline (Raft's tick, SWIM's next probe)."""

    def tick(self, now: float) -> None:
        """Run the cores' timers that are due now."""


class NodeTimers:
    """The node's one loop and its chores' schedule; see the module docstring."""

    def __init__(self, cores: Cores, events: NodeEvents, clock: Callable[[], float]) -> None:
        self.cores, self.events, self.clock = cores, events, clock
        now = clock()
        self.stopping = False
        self._waiter: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._sleep_until = math.inf
        self.next_chores = now
        self._busy_until = now + CHORES_BUSY_FOR

    async def run(self) -> None:
        """Run timers until stop(): Raft ticks, SWIM probes, resyncs and leader chores."""
        loop = asyncio.get_running_loop()
        while not self.stopping:
            now = self.clock()
            due = self._due()
            if due > now:
                self._waiter = waiter = loop.create_future()
                self._arm(due, now)
                await waiter
                assert self._timer is not None
                self._timer.cancel()
                self._waiter, self._sleep_until = None, math.inf
            self.step()

    def _arm(self, due: float, now: float) -> None:
        """Set the sleeping loop's alarm for `due` (at most a second away)."""
        self._sleep_until = due
        delay = min(max(due - now, TIMER_FLOOR), 1.0)
        self._timer = asyncio.get_running_loop().call_later(delay, _resolve, self._waiter)

    def _due(self) -> float:
        return min(self.cores.due(), self.next_chores)

    def wake_if_sooner(self) -> None:
        """After an input: wake the loop if its next deadline came forward; move the alarm
        out if the deadline went later (an ack answered a probe), so the loop sleeps through."""
        if self._waiter is None:
            return
        due = self._due()
        if due < self._sleep_until:
            _resolve(self._waiter)
        elif due > self._sleep_until + REARM_SLACK and self._timer is not None:
            self._timer.cancel()
            self._arm(due, self.clock())

    def poke(self) -> None:
        """Something chores may act on changed: keep them on their short period for a while."""
        now = self.clock()
        self._busy_until = now + CHORES_BUSY_FOR
        self.next_chores = min(self.next_chores, now + self._chore_period(now))
        self.wake_if_sooner()

    def chores_now(self) -> None:
        """Run the chores at the next loop turn, once (the worker rang: a report to act on)."""
        self.chores_at(self.clock())

    def chores_at(self, when: float) -> None:
        """Run the chores at `when` at the latest (a quiet window ends then), once."""
        self.next_chores = min(self.next_chores, when)
        self.wake_if_sooner()

    def _chore_period(self, now: float) -> float:
        if now < self._busy_until or self.events.busy():
            return LEADER_CHORES if self.cores.role is Role.LEADER else FOLLOWER_CHORES
        return IDLE_CHORES

    def step(self) -> None:
        """Run whatever timers are due now: the cores', then the chores when they are due."""
        now = self.clock()
        self.cores.tick(now)
        if now >= self.next_chores:
            self.next_chores = math.inf  # a chores_at()/chores_now() during the pass is kept
            try:
                self.events.chores(now)
            finally:
                self.next_chores = min(self.next_chores, now + self._chore_period(now))

    def stop(self) -> None:
        """Make run() return at its next wake-up."""
        self.stopping = True
        if self._waiter is not None:
            _resolve(self._waiter)


def _resolve(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
