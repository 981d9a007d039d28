"""The clock the daemon reads: real (the OS's), or virtual (the simulation's event loop).

The node driver and the daemon's loops read time only through a Clock (the supervisor gets its
`now` from the daemon's chores), so a whole cluster can run in one process on a clock the
simulation moves: tests/house/loop.py jumps its event loop's time to the next timer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds, wall-clock seconds, and a sleep on that same clock."""

    def now(self) -> float:
        """Monotonic seconds (timers, deadlines, how long something lasted)."""

    def wall(self) -> float:
        """Seconds since the Unix epoch (what is recorded for people and other boxes)."""

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` on this clock."""


class RealClock:
    """The operating system's clocks; asyncio's loop time is time.monotonic too."""

    def now(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def wall(self) -> float:
        """time.time()."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """asyncio.sleep."""
        await asyncio.sleep(seconds)


class LoopClock:
    """The running event loop's time as the clock: virtual when the loop is the simulation's
    (its time jumps to the next timer instead of waiting), with the wall clock `epoch` + that."""

    def __init__(self, loop: asyncio.AbstractEventLoop, epoch: float = 1.7e9) -> None:
        self._loop, self._epoch = loop, epoch

    def now(self) -> float:
        """The loop's time."""
        return self._loop.time()

    def wall(self) -> float:
        """epoch + the loop's time."""
        return self._epoch + self._loop.time()

    async def sleep(self, seconds: float) -> None:
        """asyncio.sleep on the loop (virtual seconds when the loop is virtual)."""
        await asyncio.sleep(seconds)


REAL = RealClock()
