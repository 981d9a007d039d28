"""Steady-state step time for scripts/bench_recovery.py: jobs trained in turn in short windows
(the others' training processes SIGSTOPped), unpinned on three boxes or with each of two boxes
pinned to its own core, and the per-round ratios and /proc CPU accounting of those windows."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import NamedTuple

from recovery_common import (
    core_busy,
    cpu_seconds,
    descendants,
    fmt_ms,
    loadavg,
    med,
    signal_all,
    spread,
    step_times,
    thread_cpus,
    wait_until,
)
from recovery_dpeer import DpeerSide
from recovery_torchrun import TorchrunSide

ALT_WINDOW, ALT_SETTLE = 0.5, 0.1  # s per arm and window; steps in a window's first 0.1 s are skipped
PIN_NODES = ["n1", "n2"]
PIN_CORES = {"n1": 0, "n2": 1}  # box -> the one core its agent or daemon and its worker run on

Side = TorchrunSide | DpeerSide
Sample = dict[str, dict[int, float | None]]


class Window(NamedTuple):
    """One arm's turn: round, arm, wall start and end, and the CPU samples taken at both ends."""

    round: int
    arm: str
    start: float
    end: float
    cpu0: Sample | None
    cpu1: Sample | None


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


def alternate(pids: dict[str, list[int]], rounds: int, log: Callable[[str], None],
              sample: Callable[[], Sample] | None = None) -> list[Window]:
    """Give each arm in turn one ALT_WINDOW per round while the others' pids are SIGSTOPped, always
    in the same cycle (no arm paused for more than the others' windows); sample() at each end."""
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
                c0 = sample() if sample else None
                time.sleep(ALT_WINDOW)
                w1 = time.time()
                windows.append(Window(k, name, w0, w1, c0, sample() if sample else None))
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


def check_pins(trees: dict[str, dict[str, list[int]]], cores: dict[str, int]) -> dict[str, dict[str, list]]:
    """Per arm and box, [core, pids] once every thread of the box's processes is on its core alone;
    RuntimeError naming the first process that is not (the measurement would not be fair)."""
    out: dict[str, dict[str, list]] = {}
    for arm, boxes in trees.items():
        for node, tree in boxes.items():
            for pid in tree:
                got = thread_cpus(pid)
                if got != {cores[node]}:
                    raise RuntimeError(f"{arm} {node}: pid {pid} runs on cpus {sorted(got)}, not {cores[node]}")
            out.setdefault(arm, {})[node] = [cores[node], tree]
    return out


def cpu_delta(w: Window, pids: list[int]) -> float:
    """CPU seconds the pids used during window w (those gone count 0)."""
    return sum((w.cpu1["pid"].get(p) or 0.0) - (w.cpu0["pid"].get(p) or 0.0) for p in pids
               if w.cpu0["pid"].get(p) is not None)


def window_cpu(w: Window, trees: dict[str, dict[str, list[int]]], cores: dict[str, int]) -> dict:
    """CPU per second of wall in window w, per box: the measured arm's agent or daemon ("top") and
    workers, the paused arm's processes ("paused_arm"), and everything else on that core ("other")."""
    dur = w.end - w.start
    out: dict[str, dict[str, float]] = {}
    for node, core in cores.items():
        top = trees[w.arm][node][0]
        own_top = cpu_delta(w, [top]) / dur
        own_workers = cpu_delta(w, trees[w.arm][node][1:]) / dur
        paused = sum(cpu_delta(w, boxes[node]) for arm, boxes in trees.items() if arm != w.arm) / dur
        busy = (w.cpu1["core"][core] - w.cpu0["core"][core]) / dur
        out[node] = {"top": own_top, "workers": own_workers, "paused_arm": paused,
                     "other": busy - own_top - own_workers - paused}
    return out


def run_pinned(tr: TorchrunSide, dp: DpeerSide, rounds: int, log: Callable[[str], None], res: dict) -> None:
    """torchrun and dpeer, world size 2, each box (agent or daemon with its worker) pinned to its own
    core (n1 on core 0, n2 on core 1, for both jobs), trained in turn in ALT_WINDOWs as in
    run_alternating; per window, every process's CPU from /proc/PID/stat and each core's busy time
    from /proc/stat. Reports per-round dpeer/torchrun ratios (median [quartiles]), the same with
    the paused job's background CPU taken out of each window (first order: a step takes
    1 / (1 - share) longer when a share of the core goes elsewhere), worker CPU per step, and the
    agents' and daemons' CPU per second while their job trains and while it is paused."""
    arms: dict[str, Side] = {"torchrun": tr, "dpeer": dp}
    start_training(arms, log)
    trees = {name: {n: descendants(top) for n, top in side.tops().items()} for name, side in arms.items()}
    res["pins"] = check_pins(trees, PIN_CORES)
    log("pinned: " + "; ".join(f"{arm} {n} on cpu {c} ({len(t)} processes)" for arm, boxes in res["pins"].items()
                               for n, (c, t) in boxes.items()))
    everyone = [p for boxes in trees.values() for tree in boxes.values() for p in tree]
    cores = sorted(PIN_CORES.values())

    def sample() -> Sample:
        return {"pid": {p: cpu_seconds(p) for p in everyone}, "core": core_busy(cores)}

    t_begin = time.time()
    load0 = loadavg()
    windows = alternate({name: [p for t in boxes.values() for p in t[1:]] for name, boxes in trees.items()},
                        rounds, log, sample)
    res["load"] = [load0, loadavg()]
    res["roles"] = {n: dp.role(n) for n in dp.nodes}
    res["failed_reports"] = failed_reports(arms, t_begin)
    res["worker_restarts"] = {name: sorted({p for t in boxes.values() for p in t[1:]} ^ set(worker_pids(arms[name])))
                              for name, boxes in trees.items()}
    records = {name: side.steady_records("n1") for name, side in arms.items()}
    per, rate = per_round(records, windows, rounds)
    cpu = [window_cpu(w, trees, PIN_CORES) for w in windows]
    paused_share: dict[str, list[float | None]] = {name: [None] * rounds for name in arms}
    for w, c in zip(windows, cpu):
        paused_share[w.arm][w.round] = sum(b["paused_arm"] for b in c.values()) / len(c)
    ratios, means, corrected = [], [], []
    for k in range(rounds):
        d, t, dr, trr = per["dpeer"][k], per["torchrun"][k], rate["dpeer"][k], rate["torchrun"][k]
        if d and t:
            ratios.append(d / t)
            corrected.append(d * (1 - paused_share["dpeer"][k]) / (t * (1 - paused_share["torchrun"][k])))
        if dr and trr:
            means.append(trr / dr)
    res |= {"window": ALT_WINDOW, "rounds": rounds, "median_step": per, "steps_per_s": rate, "ratio": ratios,
            "mean_ratio": means, "corrected_ratio": corrected, "cpu": cpu_totals(windows, cpu, records),
            "cpu_windows": [(w.round, w.arm, c) for w, c in zip(windows, cpu)]}
    log(f"pinned dpeer/torchrun over {len(ratios)} rounds: median-step ratio {spread(ratios)}, mean-step ratio "
        f"{spread(means)}, paused job's CPU taken out {spread(corrected)}; median steps "
        f"{fmt_ms(med(per['dpeer']))} vs {fmt_ms(med(per['torchrun']))}")
    log(f"pinned: dpeer roles {res['roles']}, group failures {res['failed_reports']}, "
        f"worker processes changed {res['worker_restarts']}")


def cpu_totals(windows: list[Window], cpu: list[dict], records: dict[str, list[tuple[float, int]]]) -> dict:
    """Per arm, over its windows: CPU seconds per wall second of each box's agent or daemon and of
    the other arm's processes while paused, n1's worker CPU per committed step, other load per core."""
    out: dict[str, dict] = {}
    for arm, recs in records.items():
        mine = [(w, c) for w, c in zip(windows, cpu) if w.arm == arm]
        wall = sum(w.end - w.start for w, _c in mine)
        steps = sum(sum(1 for t, _s in recs if w.start < t <= w.end) for w, _c in mine)
        out[arm] = {
            "top_cpu_per_s": {n: sum(c[n]["top"] * (w.end - w.start) for w, c in mine) / wall for n in PIN_NODES},
            "paused_arm_cpu_per_s": {n: sum(c[n]["paused_arm"] * (w.end - w.start) for w, c in mine) / wall
                                     for n in PIN_NODES},
            "worker_cpu_per_step": sum(c["n1"]["workers"] * (w.end - w.start) for w, c in mine) / steps if steps else None,
            "other_cpu_per_s": {n: med([c[n]["other"] for _w, c in mine]) for n in PIN_NODES},
            "wall": wall, "steps_n1": steps,
        }
    return out


def pinned_cores_available() -> bool:
    """True when this process may run on every core PIN_CORES names."""
    return set(PIN_CORES.values()) <= os.sched_getaffinity(0)
