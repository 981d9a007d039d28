"""Dissemination half of the membership core: gossip rounds, push-pull anti-entropy, reconnects.

A mixin of core.Membership, split out so each file stays one concern; pure like the rest of
the core. The class declares what it uses of core.Membership, which sets or defines all of it.
"""

from __future__ import annotations

import math
import random
from typing import Callable

from dpeer.membership.config import MembershipConfig
from dpeer.membership.messages import Gossip, Heartbeat, MemberRecord, MemberState, Message, PushPull, Update
from dpeer.membership.state import LIVE, MemberRow, MemberTable

ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
NEVER = math.inf
Datagram = tuple[str, Message]  # (address, message): what the core hands its caller to send


def push_pull_scale(interval: float, n: int) -> float:
    """memberlist's pushPullScale: beyond 32 nodes, exchange full state less often."""
    if n <= 32:
        return interval
    return interval * (math.ceil(math.log2(n) - math.log2(32)) + 1)


def is_live(member: MemberRow) -> bool:
    """Alive or suspect: still probed and gossiped to."""
    return member.state in LIVE


class Dissemination:
    """Gossip, push-pull and reconnect rounds of core.Membership."""

    # The state core.Membership sets in __init__ (num_live is its property).
    config: MembershipConfig
    num_live: int
    _rng: random.Random
    _table: MemberTable
    _seeds: tuple[str, ...]  # join addresses, retried while no member is live
    _leaving: bool
    _next_push_pull: float
    _next_reconnect: float

    # The operations core.Membership defines: our heartbeat and record, the updates to
    # piggyback, and the merge rules for an alive, suspect or dead/left claim.
    _hb: Callable[[float], Heartbeat]
    _self_record: Callable[[], MemberRecord]
    _piggyback: Callable[[], tuple[Update, ...]]
    _alive: Callable[[float, str, str, int], None]
    _suspect: Callable[[float, str, int, str, bool, str | None, list[Datagram]], None]
    _dead: Callable[[float, str, int, str, bool, str | None, list[Datagram]], None]

    def _gossip_round(self, now: float, out: list[Datagram]) -> None:
        hb = self._hb(now)
        for member in self._table.sample(self._rng, self.config.gossip_nodes, is_live):
            updates = self._piggyback()
            if not updates:
                return
            out.append((member.addr, Gossip(hb, updates)))

    def _push_pull_round(self, now: float, out: list[Datagram]) -> None:
        if self._leaving:
            self._next_push_pull = NEVER
            return
        if self._table.live == 0 and self._seeds:
            self._next_push_pull = now + 2 * self.config.probe_interval
            state = self._push_pull(now, join=True, reply=False)
            out.extend((seed, state) for seed in self._seeds)
            return
        n = self.num_live
        self._next_push_pull = now + push_pull_scale(self.config.push_pull_interval, n)
        for member in self._table.sample(self._rng, 1, lambda m: m.state is ALIVE):
            out.append((member.addr, self._push_pull(now, join=False, reply=False)))

    def _reconnect_round(self, now: float, out: list[Datagram]) -> None:
        if self._leaving:
            self._next_reconnect = NEVER
            return
        for member in self._table.sample(self._rng, 1, lambda m: m.state is DEAD):
            out.append((member.addr, self._push_pull(now, join=False, reply=False)))

    def _on_push_pull(self, now: float, msg: PushPull, out: list[Datagram]) -> None:
        for record in msg.members:
            self._merge(now, record, msg.hb.node_id, msg.hb.addr, out)
        if not msg.reply:
            out.append((msg.hb.addr, self._push_pull(now, join=False, reply=True)))

    def _merge(self, now: float, record: MemberRecord, origin: str, sender: str, out: list[Datagram]) -> None:
        if record.state is ALIVE:
            self._alive(now, record.node_id, record.addr, record.incarnation)
        elif record.state is LEFT:
            self._dead(now, record.node_id, record.incarnation, record.node_id, True, sender, out)
        else:
            self._suspect(now, record.node_id, record.incarnation, origin, False, sender, out)
        member = self._table.get(record.node_id)
        if member is not None and member.incarnation == record.incarnation and record.last_applied > member.last_applied:
            member.term, member.last_applied, member.commit_index = record.term, record.last_applied, record.commit_index

    def _push_pull(self, now: float, join: bool, reply: bool) -> PushPull:
        records = (self._self_record(), *(m.record() for m in self._table))
        return PushPull(self._hb(now), records, join, reply)

