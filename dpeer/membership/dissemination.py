"""How news spreads for core.Membership: the queue of updates piggybacked on every message,
gossip rounds that push it to a few random members, push-pull anti-entropy (and join), and the
reconnect rounds that let the two sides of a healed partition find each other.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dpeer.membership.broadcast import BroadcastQueue, retransmit_limit
from dpeer.membership.messages import Datagram, Gossip, MemberState, PushPull, Update
from dpeer.membership.table import LIVE, MemberRow
from dpeer.membership.timers import NEVER

if TYPE_CHECKING:
    from dpeer.membership.core import Membership

ALIVE, DEAD = MemberState.ALIVE, MemberState.DEAD


def push_pull_scale(interval: float, n: int) -> float:
    """memberlist's pushPullScale: beyond 32 nodes, exchange full state less often."""
    if n <= 32:
        return interval
    return interval * (math.ceil(math.log2(n) - math.log2(32)) + 1)


def is_live(member: MemberRow) -> bool:
    """Alive or suspect: still probed and gossiped to."""
    return member.state in LIVE


class Dissemination:
    """queue: the updates to piggyback, each sent a bounded number of times; seeds: the join
    addresses, retried while no member is live; next_gossip, next_push_pull, next_reconnect:
    when each round is next due (NEVER once leaving, for the last two)."""

    def __init__(self, node: Membership, now: float) -> None:
        self.node = node
        self.queue = BroadcastQueue()
        self.seeds: tuple[str, ...] = ()
        config, rng = node.config, node.rng
        self.next_gossip = now + rng.uniform(0, config.gossip_interval)
        self.next_reconnect = now + rng.uniform(0, config.reconnect_interval)
        self.next_push_pull = now + rng.uniform(0, push_pull_scale(config.push_pull_interval, node.num_live))

    def push(self, update: Update) -> None:
        """Queue an update to piggyback (it replaces a queued one about the same node)."""
        self.queue.push(update)

    def piggyback(self) -> tuple[Update, ...]:
        """The updates to carry on the next message, each counted as sent once more."""
        if not len(self.queue):
            return ()
        limit = retransmit_limit(self.node.config.retransmit_mult, self.node.num_live)
        return self.queue.take(self.node.config.max_piggyback, limit)

    def join(self, now: float, seeds: tuple[str, ...]) -> list[Datagram]:
        """Announce ourselves and start a full state exchange with each seed (retried by push-pull
        rounds while we know nobody)."""
        self.seeds = seeds
        self.push(self.node.own_update())
        self.next_push_pull = now + 2 * self.node.config.probe_interval
        state = self._push_pull(now, join=True, reply=False)
        return [(seed, state) for seed in self.seeds]

    def announce(self, now: float, update: Update) -> list[Datagram]:
        """Queue an update and send it at once to a few live members (our `left`, when leaving)."""
        self.push(update)
        peers = self.node.roster.table.sample(self.node.rng, self.node.config.gossip_nodes, is_live)
        return [(m.addr, Gossip(self.node.heartbeat(now), (update,))) for m in peers]

    def next_due(self) -> float:
        """When the soonest round is due (gossip only while something is queued)."""
        gossip = self.next_gossip if len(self.queue) else NEVER
        return min(gossip, self.next_push_pull, self.next_reconnect)

    def tick(self, now: float, out: list[Datagram]) -> None:
        """Run the gossip, push-pull and reconnect rounds due at `now`, in that order."""
        config = self.node.config
        if now >= self.next_gossip and len(self.queue):
            self.next_gossip = now + config.gossip_interval
            self._gossip_round(now, out)
        if now >= self.next_push_pull:
            self._push_pull_round(now, out)
        if now >= self.next_reconnect:
            self.next_reconnect = now + config.reconnect_interval
            self._reconnect_round(now, out)

    def on_push_pull(self, now: float, msg: PushPull, out: list[Datagram]) -> None:
        """Merge a peer's full state, and answer with ours unless it is itself an answer."""
        for record in msg.members:
            self.node.roster.merge(now, record, msg.hb.node_id, msg.hb.addr, out)
        if not msg.reply:
            out.append((msg.hb.addr, self._push_pull(now, join=False, reply=True)))

    def _gossip_round(self, now: float, out: list[Datagram]) -> None:
        node = self.node
        hb = node.heartbeat(now)
        for member in node.roster.table.sample(node.rng, node.config.gossip_nodes, is_live):
            updates = self.piggyback()
            if not updates:
                return
            out.append((member.addr, Gossip(hb, updates)))

    def _push_pull_round(self, now: float, out: list[Datagram]) -> None:
        node = self.node
        if node.leaving:
            self.next_push_pull = NEVER
            return
        table = node.roster.table
        if table.live == 0 and self.seeds:
            self.next_push_pull = now + 2 * node.config.probe_interval
            state = self._push_pull(now, join=True, reply=False)
            out.extend((seed, state) for seed in self.seeds)
            return
        self.next_push_pull = now + push_pull_scale(node.config.push_pull_interval, node.num_live)
        for member in table.sample(node.rng, 1, lambda m: m.state is ALIVE):
            out.append((member.addr, self._push_pull(now, join=False, reply=False)))

    def _reconnect_round(self, now: float, out: list[Datagram]) -> None:
        node = self.node
        if node.leaving:
            self.next_reconnect = NEVER
            return
        for member in node.roster.table.sample(node.rng, 1, lambda m: m.state is DEAD):
            out.append((member.addr, self._push_pull(now, join=False, reply=False)))

    def _push_pull(self, now: float, join: bool, reply: bool) -> PushPull:
        records = (self.node.own_record(), *(m.record() for m in self.node.roster.table))
        return PushPull(self.node.heartbeat(now), records, join, reply)
