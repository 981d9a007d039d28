"""Steady-state step time for scripts/bench_recovery.py: jobs trained in turn in short windows
(the others' training processes SIGSTOPped) and the per-round ratios of those windows."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import NamedTuple

from recovery_common import (
    descendants,
    fmt_ms,
    loadavg,
    med,
    signal_all,
    spread,
    step_times,
    wait_until,
)
from recovery_dpeer import DpeerSide
from recovery_torchrun import TorchrunSide

ALT_WINDOW, ALT_SETTLE = 0.5, 0.1  # s per arm and window; steps in a window's first 0.1 s are skipped

Side = TorchrunSide | DpeerSide


class Window(NamedTuple):
    """One arm's turn: round, arm, wall start and end."""

    round: int
    arm: str
    start: float
    end: float


def worker_pids(side: Side) -> list[int]:
    """The training processes of a side: everything below its agents or daemons, not those."""
    return [pid for top in side.tops().values() for pid in descendants(top)[1:]]


def start_training(arms: dict[str, Side], log: Callable[[str], None]) -> None:
    """Start every arm, wait until each trains with all its boxes, then 2 s more to settle."""
    t0 = time.time()
    for side in arms.values():
        side.start_all()
    boxes = len(next(iter(arms.values())).nodes)
    wait_until(lambda: all(s.training_together(s.nodes, len(s.nodes), t0) for s in arms.values()), 300,
               f"every job training with {boxes} boxes", 0.1)
    log(f"alternating: {', '.join(arms)} training {time.time() - t0:.1f}s after launch")
    time.sleep(2.0)


def alternate(pids: dict[str, list[int]], rounds: int, log: Callable[[str], None]) -> list[Window]:
    """Give each arm in turn one ALT_WINDOW per round while the others' pids are SIGSTOPped, always
    in the same cycle (no arm paused for more than the others' windows)."""
    names = list(pids)
    windows: list[Window] = []
    try:
        for k in range(rounds):
            for name in names:
                for other in names:
                    if other != name:
                        signal_all(pids[other], signal.SIGSTOP)
                signal_all(pids[name], signal.SIGCONT)
                w0 = time.time()
                time.sleep(ALT_WINDOW)
                w1 = time.time()
                windows.append(Window(k, name, w0, w1))
            if k % 10 == 9:
                log(f"alternating: {k + 1}/{rounds} rounds")
    finally:
        for name in names:
            signal_all(pids[name], signal.SIGCONT)
    return windows


def per_round(records: dict[str, list[tuple[float, int]]], windows: list[Window],
              rounds: int) -> tuple[dict[str, list[float | None]], dict[str, list[float | None]]]:
    """Per arm and round, the median step interval and the steps per second of its window."""
    per: dict[str, list[float | None]] = {name: [None] * rounds for name in records}
    rate: dict[str, list[float | None]] = {name: [None] * rounds for name in records}
    for w in windows:
        xs = step_times(records[w.arm], w.start + ALT_SETTLE, w.end)
        per[w.arm][w.round] = med(xs)
        rate[w.arm][w.round] = len(xs) / (w.end - w.start - ALT_SETTLE) if xs else None
    return per, rate


def failed_reports(arms: dict[str, Side], after: float) -> dict[str, int]:
    """Per dpeer arm, its workers' group failures reported after `after`."""
    return {name: sum(1 for n in side.nodes for r in side.reports(n) if r["kind"] == "failed" and r["t"] > after)
            for name, side in arms.items() if isinstance(side, DpeerSide)}


def run_alternating(arms: dict[str, Side], rounds: int, log: Callable[[str], None], res: dict) -> None:
    """Every job trains on three boxes, but only one at a time: in each round every arm gets one
    ALT_WINDOW while the other arms' training processes are SIGSTOPped (their daemons and agents
    keep running). The arms always take turns in the same cycle, so no job is paused for more
    than two windows (1 s), well below dpeer's 2 s collective-timeout floor (a rotating order
    paused some for four and made their groups time out and re-form). A round's arms see the
    same background load, so the per-round ratios of median step times are what this reports
    (median and quartiles over the rounds); dpeer group failures during the rounds are counted."""
    start_training(arms, log)
    pids = {name: worker_pids(side) for name, side in arms.items()}
    t_begin = time.time()
    windows = alternate(pids, rounds, log)
    names = list(arms)
    per, rate = per_round({name: side.steady_records("n1") for name, side in arms.items()}, windows, rounds)
    res["failed_reports"] = failed_reports(arms, t_begin)
    base = names[0]
    res |= {"window": ALT_WINDOW, "rounds": rounds, "median_step": {n: per[n] for n in names},
            "steps_per_s": {n: rate[n] for n in names}, "load": loadavg(), "ratio": {}, "mean_ratio": {}}
    for name in names[1:]:
        ratios = [a / b for a, b in zip(per[name], per[base]) if a and b]
        means = [b / a for a, b in zip(rate[name], rate[base]) if a and b]
        res["ratio"][name], res["mean_ratio"][name] = ratios, means
        log(f"alternating {name}/{base} over {len(ratios)} rounds: median-step ratio {spread(ratios)}, "
            f"mean-step ratio {spread(means)}; median steps {fmt_ms(med(per[name]))} vs {fmt_ms(med(per[base]))}")
    log(f"alternating: dpeer group failures during the rounds {res['failed_reports']}")
