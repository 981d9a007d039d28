"""Drives a `Membership` core as a simulator actor: node ids stand for addresses (`id:7946`)."""

from __future__ import annotations

import random
from typing import Any, Callable, Iterable

from dpeer.membership.config import MembershipConfig
from dpeer.membership.core import Membership, Datagram
from dpeer.membership.effects import Effect
from dpeer.membership.messages import MemberRecord, Message

SIM_PORT = 7946
EffectSink = Callable[[float, str, Effect], None]


def sim_addr(node_id: str) -> str:
    """The address a simulated node listens on."""
    return f"{node_id}:{SIM_PORT}"


def sim_node(addr: str) -> str:
    """The simulated node listening on addr."""
    return addr.rpartition(":")[0]


class SimMember:
    """A simulator actor around one membership core; effects go to `sink` as they happen."""

    def __init__(
        self,
        node_id: str,
        config: MembershipConfig,
        seed: int,
        now: float = 0.0,
        incarnation: int = 0,
        known: Iterable[MemberRecord] = (),
        seeds: Iterable[str] = (),
        sink: EffectSink | None = None,
    ) -> None:
        self.node_id = node_id
        self.core = Membership(node_id, sim_addr(node_id), config, random.Random(seed), now, incarnation, known)
        self.left_at: float | None = None
        self._sink = sink
        self._seeds = [sim_addr(s) for s in seeds]
        self._start = now if self._seeds else None
        self._leave_requested = False

    def request_leave(self) -> None:
        """Leave gracefully at the next tick (the simulator offers no way to send from outside)."""
        self._leave_requested = True

    def receive(self, now: float, src: str, msg: Message) -> list[tuple[str, Any]]:
        """Simulator hook: one delivered message."""
        return self._out(now, self.core.receive(now, msg))

    def tick(self, now: float) -> list[tuple[str, Any]]:
        """Simulator hook: timers (and a pending join or leave)."""
        out: list[Datagram] = []
        if self._start is not None:
            self._start = None
            out.extend(self.core.join(now, self._seeds))
        if self._leave_requested and self.left_at is None:
            self.left_at = now
            out.extend(self.core.leave(now))
        out.extend(self.core.tick(now))
        return self._out(now, out)

    def next_tick(self) -> float | None:
        """Simulator hook: when to tick next."""
        if self._start is not None:
            return self._start
        return self.core.next_tick()


    def unreachable(self, now: float, dst: str) -> list[tuple[str, Any]]:
        """Simulator hook: a message to dst found no process (connection refused)."""
        return self._out(now, self.core.unreachable(now, sim_addr(dst)))

    def _out(self, now: float, out: list[Datagram]) -> list[tuple[str, Any]]:
        effects = self.core.drain_effects()
        if self._sink is not None:
            for effect in effects:
                self._sink(now, self.node_id, effect)
        return [(sim_node(addr), msg) for addr, msg in out]
