"""Whether a worker process is hung, or missed its group, as pure table-tested decisions.

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


def missed_view(view_generation: int, in_view: bool, worker_ready: bool, given_generation: int) -> Health:
    """Whether the worker waits on a group it can never form: the committed view names this box
    but was handed to an earlier worker process (a crash, a hang, a restart of the box). Its
    peers hold or held that group already, and a view with the same members never changes by
    itself, so the group must be re-formed under a new generation (``hung`` is then True)."""
    if not in_view or not worker_ready:
        return Health(False, "the worker is not waiting on a view that names this box")
    if given_generation >= view_generation:
        return Health(False, f"the worker was given generation {view_generation}")
    return Health(True, f"the worker started after generation {view_generation} was handed out; "
                        "it needs a new generation to take part")
