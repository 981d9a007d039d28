"""Giving up a step's collective once a newer view is committed and the collective is overdue.

A survivor's Gloo receive can wait out the whole collective timeout (2 s or more; 30 s in a heal) although the
daemons committed the next view within milliseconds: seen when one survivor's ring neighbour had
already failed and left while this one still waited on it, and when a peer stops without closing
its connections (SIGSTOP, a cut link). A committed newer view means the generation is over,
whatever its collective still waits for, when that view drops one of the group's members or
re-forms the same ones (decisions.should_cut). So while a step's collective runs, a thread looks
(every IDLE_S, then every PERIOD_S once it is overdue): once the collective has run ``patience``
seconds and such a view is committed, it cuts the group (GroupManager.cut), the collective fails at
once, and the worker reports it and re-forms in the newer view as after any failure. A view that
only adds members is most often a planned switch: it cuts only far past the patience.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from dpeer.trainer.decisions import should_cut

PERIOD_S = 0.01  # how often the watch asks for a newer view while a collective is overdue
IDLE_S = 0.05  # how often it looks whether the collective running now is overdue (20 wakeups a second)
PATIENCE_FLOOR_S = 0.1  # a collective is overdue after at least this long
PATIENCE_STEPS = 4  # ... and at least this many typical step times
GUARD_S = 1.0  # how often the guard is asked whether strangers' connections pile up on the data plane


def patience(step_times: list[float]) -> float:
    """How long a step's collective may run before a newer view makes the watch cut it."""
    recent = sorted(step_times[-20:])
    typical = recent[len(recent) // 2] if recent else 0.0
    return max(PATIENCE_FLOOR_S, PATIENCE_STEPS * typical)


class CollectiveWatch:
    """A thread that cuts an overdue collective once a newer view says nobody will complete it
    (decisions.should_cut)."""

    def __init__(self, newer: Callable[[int], tuple[str, ...] | None],
                 on_cut: Callable[[int, float, str], None] = lambda generation, seconds, why: None,
                 guard: Callable[[], Intrusion | None] = lambda: None) -> None:
        """``newer(generation)``: the members of the newest committed view after it, None if none
        (it may raise: a view file read half-way is no newer view yet); ``on_cut(generation,
        seconds the collective had run, why)`` records a cut before it is made (the watch's thread);
        ``guard()``, asked every GUARD_S, names a group to cut whatever it is doing (strangers'
        connections piling up on its data-plane port), or None."""
        self._newer, self._on_cut, self._guard = newer, on_cut, guard
        self._armed: _Armed | None = None
        self._stop = threading.Event()
        self.cuts = 0
        self._thread = threading.Thread(target=self._run, name="dpeer-collective-watch", daemon=True)
        self._thread.start()

    def arm(self, generation: int, members: tuple[str, ...], patience_s: float, cut: Callable[[], int],
            drops_only: bool = False) -> None:
        """A collective of ``generation`` (its ``members``) starts now (the worker's main thread);
        ``cut`` fails that very group's pending operations (never a later group's); ``drops_only``:
        only a newer view that drops a member cuts it (a heal's, see decisions.should_cut)."""
        self._armed = _Armed(generation, members, time.monotonic(), patience_s, cut, drops_only)

    def disarm(self) -> None:
        """The collective returned or raised."""
        self._armed = None

    def close(self) -> None:
        """End the thread."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        wait, guarded = IDLE_S, time.monotonic()
        while not self._stop.wait(wait):
            if time.monotonic() - guarded >= GUARD_S:
                guarded = time.monotonic()
                self._check_guard()
            wait, armed = IDLE_S, self._armed
            if armed is None:
                continue
            overdue = time.monotonic() - armed.started
            if overdue < armed.patience:
                continue
            wait = PERIOD_S
            try:
                newer = self._newer(armed.generation)
            except (OSError, ValueError, KeyError, TypeError):  # a view being written: look again
                continue
            decision = should_cut(armed.members, newer, overdue, armed.patience, armed.drops_only)
            if not decision.cut or self._armed is not armed:
                continue
            self._on_cut(armed.generation, overdue, decision.reason)
            armed.cut()
            self._armed, self.cuts = None, self.cuts + 1


    def _check_guard(self) -> None:
        intrusion = self._guard()
        if intrusion is not None:
            self._on_cut(intrusion.generation, 0.0, intrusion.why)
            intrusion.cut()
            self.cuts += 1


@dataclass(frozen=True)
class Intrusion:
    """A group to cut now, and why (the guard's answer)."""

    generation: int
    why: str
    cut: Callable[[], int]


@dataclass(frozen=True)
class _Armed:
    generation: int
    members: tuple[str, ...]
    started: float
    patience: float
    cut: Callable[[], int]
    drops_only: bool = False
