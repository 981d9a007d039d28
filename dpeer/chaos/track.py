"""Recording, from the latest status samples, when the survivors recover and when faulted nodes return."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpeer.chaos.options import DISRUPTIVE
from dpeer.chaos.sample import done_of, group_of, train_of
from dpeer.chaos.schedule import Fault

if TYPE_CHECKING:
    from dpeer.chaos.run import Run


def track(run: Run) -> None:
    """Record recoveries and returns seen in the latest samples."""
    t = run.now()
    for f in run.faults:
        if f.recovered_s is None:
            _track_recovery(run, f, t)
        if f.ended_at is not None and f.back_s is None:
            _track_return(run, f, t, t - f.ended_at)


def _track_recovery(run: Run, f: Fault, t: float) -> None:
    """The survivors' next committed step: in a new generation, or in the same group once the fault ended."""
    survivors = {n: d for n, d in run.latest.items() if n not in f.nodes and d}
    floor = max(f.step_at, f.old_gen_step)
    for d in survivors.values():
        step, gen = train_of(d).get("step", -1), group_of(d).get("generation", 0)
        if gen > f.gen_at and step > floor:
            f.recovered_s, f.recovered_how = round(t - f.at, 3), "re-formed"
            return
        if (f.ended_at is not None or f.kind not in DISRUPTIVE) and step > floor:
            f.recovered_s, f.recovered_how = round(t - f.at, 3), "same group"
            return
    if f.ended_at is None and f.kind in DISRUPTIVE:
        # steps the old group still commits (a partitioned node's worker trains on until
        # it is fenced) do not count as recovery: the next step must be a new group's
        f.old_gen_step = max([f.old_gen_step] + [train_of(d).get("step", -1) for d in survivors.values()
                                                 if group_of(d).get("generation", 0) <= f.gen_at])


def _track_return(run: Run, f: Fault, t: float, since_end: float) -> None:
    """The faulted node trains in a group again (or the job finished with it done)."""
    for vid in f.nodes:
        d = run.latest.get(vid)
        if d and vid in (group_of(d).get("members") or []) and train_of(d).get("step", -1) > f.step_at_end:
            f.back_s = round(max(0.0, since_end), 3)
            f.out_s = round(t - f.at, 3)
    if f.back_s is None and run.done_at is not None and all(done_of(run.latest.get(v)) for v in f.nodes):
        f.back_s = round(max(0.0, since_end), 3)
        f.out_s = round(t - f.at, 3)
