"""A transmit-limited queue of membership updates to piggyback (memberlist's
TransmitLimitedQueue): each update is sent a bounded number of times, least-sent first, and a
newer update about a node replaces the queued older one."""

from __future__ import annotations

import math

from dpeer.membership.messages import Update


def retransmit_limit(mult: int, n: int) -> int:
    """How many times one update is sent: mult * ceil(log10(n + 1)) (memberlist)."""
    return mult * max(1, math.ceil(math.log10(n + 1)))


class BroadcastQueue:
    """Updates bucketed by how often they were sent; O(taken) per message."""

    def __init__(self) -> None:
        self._buckets: list[dict[str, Update]] = [{}]
        self._sent: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._sent)

    def push(self, update: Update) -> None:
        """Queue an update, replacing any queued update about the same node."""
        old = self._sent.pop(update.node_id, None)
        if old is not None:
            del self._buckets[old][update.node_id]
        self._buckets[0][update.node_id] = update
        self._sent[update.node_id] = 0

    def take(self, max_count: int, limit: int) -> tuple[Update, ...]:
        """Up to max_count updates, least-sent and newest first; each counts as sent once more."""
        taken: list[Update] = []
        for bucket in self._buckets:
            if len(taken) >= max_count:
                break
            for node_id in reversed(bucket):
                if len(taken) >= max_count:
                    break
                taken.append(bucket[node_id])
        for update in taken:
            self._bump(update.node_id, limit)
        return tuple(taken)

    def _bump(self, node_id: str, limit: int) -> None:
        sent = self._sent[node_id]
        update = self._buckets[sent].pop(node_id)
        if sent + 1 >= limit:
            del self._sent[node_id]
            return
        if sent + 1 == len(self._buckets):
            self._buckets.append({})
        self._buckets[sent + 1][node_id] = update
        self._sent[node_id] = sent + 1
