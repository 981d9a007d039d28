"""Lifeguard's suspicion timer: starts at a maximum and shrinks towards a minimum with each
independent confirmation (memberlist suspicion.go), so a suspect that many see is declared dead
quickly while a lone, possibly mistaken suspicion waits long enough to be refuted."""

from __future__ import annotations

import math


def suspicion_timeout(mult: float, n: int, interval: float) -> float:
    """The minimum suspicion timeout: mult * max(1, log10(n)) * probe interval (memberlist)."""
    return mult * max(1.0, math.log10(max(1, n))) * interval


class Suspicion:
    """One suspicion of one member at one incarnation; tracks who confirmed it and its deadline."""

    __slots__ = ("start", "min", "max", "k", "confirmed", "deadline", "refused", "refused_here")

    def __init__(self, origin: str, now: float, k: int, low: float, high: float, refused: bool) -> None:
        self.start = now
        self.min = low
        self.max = high
        self.k = k
        self.confirmed = {origin}
        self.refused = refused
        self.refused_here = False  # this node itself had a connection to the member refused
        self.deadline = now + (low if k < 1 else high)

    def confirm(self, origin: str) -> bool:
        """Count an independent confirmation; True when it is new (worth re-gossiping)."""
        if origin in self.confirmed or len(self.confirmed) > self.k:
            return False
        self.confirmed.add(origin)
        n = len(self.confirmed) - 1
        frac = math.log(n + 1.0) / math.log(self.k + 1.0)
        timeout = max(self.min, self.max - frac * (self.max - self.min))
        self.deadline = min(self.deadline, self.start + timeout)
        return True

    def expedite(self, now: float, timeout: float) -> bool:
        """A refused connection backs the suspicion: expire after `timeout`; True when it changed."""
        if self.refused and self.deadline <= now + timeout:
            return False
        self.refused = True
        self.deadline = min(self.deadline, now + timeout)
        return True
