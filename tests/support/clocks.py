"""A SyncClock the test moves: sleep() advances it at once, so a worker-side wait runs in no real time."""

from __future__ import annotations


class ManualClock:
    """dpeer.channel.local.SyncClock on a counter: `sleep` and `advance` move it; nothing blocks."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self.slept = 0.0

    def now(self) -> float:
        """The counter."""
        return self.t

    def wall(self) -> float:
        """The counter, as wall seconds too."""
        return self.t

    def sleep(self, seconds: float) -> None:
        """Move the counter instead of blocking."""
        self.advance(seconds)
        self.slept += seconds

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass."""
        self.t += seconds
