"""Failure detection under each timing preset: the simulated SWIM core (bench_membership's harness,
virtual clock, links 0.5-2 ms, no loss), 10 nodes, seeds 1-3; seconds from a SIGKILL (crash) or a
SIGSTOP (pause) of one node until every other node marks it dead. docs/operations.md quotes it.

    python scripts/bench_presets.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_membership as bench  # noqa: E402
from dpeer.membership import SeenDead, preset  # noqa: E402

NODES, SEEDS = 10, (1, 2, 3)


def all_dead(name: str, seed: int, how: str) -> float:
    """Seconds until the last of the others marks the victim dead (inf if not within 300 s)."""
    run = bench.build(NODES, seed, config=preset(name))
    run.sim.run_until(bench.WARMUP)
    victim = run.ids[NODES // 2]
    getattr(run.sim, how)(victim)
    run.run_until_seen(SeenDead, victim, NODES - 1, 300.0)
    return bench.quantile_time(run.times(SeenDead, victim, bench.WARMUP), 1.0, NODES - 1)


def main() -> None:
    """Print one line per preset and fault: the median over the seeds and the worst."""
    for name in ("lan", "wan", "edge"):
        for how in ("crash", "pause"):
            xs = [all_dead(name, s, how) for s in SEEDS]
            print(f"{name:<5} {how:<6} all dead after {statistics.median(xs):.2f} s (max {max(xs):.2f})", flush=True)


if __name__ == "__main__":
    main()
