"""Giving up a step's collective once a newer view is committed and the collective is overdue.

A survivor's Gloo receive can wait out the whole collective timeout (2 s or more) although the
daemons committed the next view within milliseconds: seen when one survivor's ring neighbour had
already failed and left while this one still waited on it, and when a peer stops without closing
its connections (SIGSTOP, a cut link). A committed newer view means the generation is over,
whatever its collective still waits for, when that view drops one of the group's members or
re-forms the same ones (decisions.should_cut). So while a step's collective runs, a thread looks
(every IDLE_S, then every PERIOD_S once it is overdue): once the collective has run ``patience``
seconds and such a view is committed, it cuts the group (GroupManager.cut), the collective fails at
once, and the worker reports it and re-forms in the newer view as after any failure. A view that
only adds members is a planned switch and never cuts, however slow the collective.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from dpeer.trainer.decisions import should_cut

PERIOD_S = 0.01  # how often the watch asks for a newer view while a collective is overdue
IDLE_S = 0.05  # how often it looks whether the collective running now is overdue (20 wakeups a second)
PATIENCE_FLOOR_S = 0.1  # a collective is overdue after at least this long
PATIENCE_STEPS = 4  # ... and at least this many typical step times


def patience(step_times: list[float]) -> float:
    """How long a step's collective may run before a newer view makes the watch cut it."""
    recent = sorted(step_times[-20:])
    typical = recent[len(recent) // 2] if recent else 0.0
    return max(PATIENCE_FLOOR_S, PATIENCE_STEPS * typical)


class CollectiveWatch:
    """A thread that cuts an overdue collective once a newer view says nobody will complete it
    (decisions.should_cut)."""

    def __init__(self, newer: Callable[[int], tuple[str, ...] | None], cut: Callable[[], int],
                 on_cut: Callable[[int, float, int, str], None] = lambda generation, seconds, cut, why: None) -> None:
        """``newer(generation)``: the members of the newest committed view after it, None if none;
        ``cut`` fails the current group's pending operations; ``on_cut(generation, seconds the
        collective had run, connections cut, why)`` reports it (called on the watch's thread)."""
        self._newer, self._cut, self._on_cut = newer, cut, on_cut
        self._armed: tuple[int, tuple[str, ...], float, float] | None = None  # generation, members, start, patience
        self._stop = threading.Event()
        self.cuts = 0
        self._thread = threading.Thread(target=self._run, name="dpeer-collective-watch", daemon=True)
        self._thread.start()

    def arm(self, generation: int, members: tuple[str, ...], patience_s: float) -> None:
        """A collective of ``generation`` (its ``members``) starts now (the worker's main thread)."""
        self._armed = (generation, members, time.monotonic(), patience_s)

    def disarm(self) -> None:
        """The collective returned or raised."""
        self._armed = None

    def close(self) -> None:
        """End the thread."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        wait = IDLE_S
        while not self._stop.wait(wait):
            wait, armed = IDLE_S, self._armed
            if armed is None:
                continue
            generation, members, started, patience_s = armed
            overdue = time.monotonic() - started
            if overdue < patience_s:
                continue
            wait = PERIOD_S
            decision = should_cut(members, self._newer(generation))
            if not decision.cut or self._armed is not armed:
                continue
            cut = self._cut()
            self._armed, self.cuts = None, self.cuts + 1
            self._on_cut(generation, overdue, cut, decision.reason)
