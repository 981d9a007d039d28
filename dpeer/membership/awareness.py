"""Lifeguard's local health awareness: when our own probes go unanswered, suspect ourselves first
and slow down, so an overloaded node does not accuse healthy peers."""

from __future__ import annotations


class Awareness:
    """A health score in [0, max_multiplier); timeouts are scaled by score + 1 (memberlist)."""

    __slots__ = ("max_multiplier", "score")

    def __init__(self, max_multiplier: int) -> None:
        self.max_multiplier = max_multiplier
        self.score = 0

    def apply(self, delta: int) -> None:
        """Raise (missed acks and nacks, refutations) or lower (acks) the score, within bounds."""
        self.score = min(self.max_multiplier - 1, max(0, self.score + delta))

    def scale(self, timeout: float) -> float:
        """A timeout stretched by our current ill health."""
        return timeout * (self.score + 1)
