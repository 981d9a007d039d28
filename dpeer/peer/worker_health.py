"""Whether a worker process is hung, as a pure table-tested decision.

A crashed worker exits and is restarted at once; a hung one (deadlocked, stuck in a collective
whose peer vanished, or stopped by a signal) stays alive and would hold its group back for good.
The daemon decides from what it sees: when the worker last wrote a report (it writes one every
step, and every second while it waits for a view) and whether the kernel says it is stopped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Health:
    """The verdict on one worker, with the reason the daemon logs."""

    hung: bool
    reason: str


def judge_worker(now: float, last_report: float, stopped_since: float | None, silent_limit: float,
                 stopped_limit: float) -> Health:
    """Hung when stopped for `stopped_limit` seconds or silent for `silent_limit` seconds."""
    if stopped_since is not None and now - stopped_since >= stopped_limit:
        return Health(True, f"stopped by a signal for {now - stopped_since:.1f}s")
    silent = now - last_report
    if silent >= silent_limit:
        return Health(True, f"no report for {silent:.1f}s (limit {silent_limit:g}s)")
    if stopped_since is not None:
        return Health(False, f"stopped for {now - stopped_since:.1f}s, under {stopped_limit:g}s")
    return Health(False, f"last report {silent:.1f}s ago")
