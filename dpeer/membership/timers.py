"""The membership core's timer heap and its sequence counter.

One counter numbers both the probes and relays that go on the wire and the heap's entries (the
tie-break of timers due at the same instant), so a seeded run replays the same numbers.
"""

from __future__ import annotations

import heapq
import math
from enum import Enum
from typing import Callable

NEVER = math.inf


class Timer(Enum):
    """What a timer in the heap is for (its key: a probe or relay seq, or a node id)."""

    SUSPICION = "suspicion"
    RELAY = "relay"
    PROBE_TIMEOUT = "probe_timeout"  # no ack yet: ask others to probe indirectly
    PROBE_DEADLINE = "probe_deadline"  # the probe period ended: suspect an unacked target
    REFUTE_BROADCAST = "refute_broadcast"  # a refutation broadcast held back by the fan-out cap


class Timers:
    """heap: (when, seq, kind, key) entries, soonest first; seq: the last number handed out."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Timer, object]] = []
        self.seq = 0

    def next_seq(self) -> int:
        """A fresh number for a probe or a relayed ping."""
        self.seq += 1
        return self.seq

    def set(self, when: float, kind: Timer, key: object) -> None:
        """Fire `kind` for `key` at `when` (an earlier timer for the same key is not cancelled)."""
        heapq.heappush(self.heap, (when, self.next_seq(), kind, key))

    def pop_due(self, now: float) -> tuple[Timer, object] | None:
        """The next timer due at `now`, removed from the heap; None when none is due."""
        if not self.heap or self.heap[0][0] > now:
            return None
        _, _, kind, key = heapq.heappop(self.heap)
        return kind, key

    def drop_stale(self, stale: Callable[[Timer, object], bool]) -> None:
        """Drop the soonest timers while firing them would do nothing (`stale` says which)."""
        while self.heap and stale(self.heap[0][2], self.heap[0][3]):
            heapq.heappop(self.heap)

    @property
    def next_due(self) -> float:
        """When the soonest timer fires (NEVER when none is set)."""
        return self.heap[0][0] if self.heap else NEVER
