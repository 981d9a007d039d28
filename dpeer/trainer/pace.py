"""The pace of the step loop: how long its steps take, and the collective timeout that follows;
how fast this box computes a micro-batch, reported to the daemon (the leader weighs each member's
share of a step by it, View.shares).

The group's collective timeout adapts to the recent step times (decisions.collective_timeout): a
hung peer is given up after a few typical steps, not after the long initial timeout, which holds
again after each re-form until the new group has a pace of its own.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dpeer.trainer.collective_watch import patience
from dpeer.trainer.decisions import collective_timeout

if TYPE_CHECKING:
    from dpeer.trainer.loop import Trainer

STEP_TIME_WINDOW = 200
ADAPT_EVERY = 8  # steps between re-computations of the adaptive timeout (a sort of the window: ~5 us)
SPEED_SMOOTHING = 0.1  # the weight of a pass's speed in the running speed
SPEED_WARMUP = 5  # passes measured before the first report (the first runs slow: allocations, the measuring pass)
SPEED_MOVE = 0.2  # a speed is reported again once it moved by more than this since the last report (about a
# speed class, daemon/decide/speeds.py: a report that cannot move the box's class only grows the log)
SPEED_REPORT_EVERY = 20  # passes at least between two reports


class Pace:
    """A trainer's step times. times: the recent steps' seconds (at most twice the window); began:
    when the step in flight began; timeout: the collective timeout last set on the group."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.times: list[float] = []
        self.began = 0.0
        self.timeout = trainer.cfg.init_timeout
        self.speed = 0.0  # micro-batches a second, smoothed (0: none measured yet)
        self.reported = 0.0  # the speed last reported
        self._passes = 0
        self._reported_at = -SPEED_REPORT_EVERY  # the pass of the last report

    def begin(self) -> None:
        """A step begins now."""
        self.began = time.monotonic()

    def end(self, step: int) -> None:
        """Step ``step`` (counted) was committed: note its time, and adapt the timeout every ADAPT_EVERY."""
        self.times.append(time.monotonic() - self.began)
        if len(self.times) > 2 * STEP_TIME_WINDOW:
            del self.times[:-STEP_TIME_WINDOW]
        if step % ADAPT_EVERY == 0:
            self.adapt()

    def restart(self) -> None:
        """A group formed and healed: the timeout starts from the initial one, adapted to the times known."""
        self.timeout = self.trainer.cfg.init_timeout
        self.adapt()

    def adapt(self) -> None:
        """Set the group's collective timeout from the step times, when it moved by more than 10 %."""
        cfg = self.trainer.cfg
        seconds, _reason = collective_timeout(
            self.times, floor=cfg.timeout_floor, mult=cfg.timeout_mult,
            initial=cfg.init_timeout, window=STEP_TIME_WINDOW,
        )
        if abs(seconds - self.timeout) > 0.1 * self.timeout:
            self.timeout = seconds
            self.trainer.group.set_timeout(seconds)

    def computed(self, seconds: float, micro_batches: int) -> None:
        """A pass ran ``micro_batches`` micro-batches in ``seconds`` (each one's fetch, forward and
        backward; not the pass's own costs or the wait for the sums, so a box given fewer micro-batches
        does not read as slower): fold it into the speed, and report the speed when it moved."""
        if micro_batches < 1 or seconds <= 0.0:
            return  # a rank with nothing to run measures nothing
        rate = micro_batches / seconds
        self.speed = rate if self.speed == 0.0 else self.speed + SPEED_SMOOTHING * (rate - self.speed)
        self._passes += 1
        due = self._passes >= SPEED_WARMUP and self._passes - self._reported_at >= SPEED_REPORT_EVERY
        if due and abs(self.speed - self.reported) > SPEED_MOVE * self.reported:
            self.reported, self._reported_at = self.speed, self._passes
            self.trainer.source.report_speed(self.speed)

    def patience(self) -> float:
        """How long a collective may run before a newer view makes the watch cut it."""
        return patience(self.times)
