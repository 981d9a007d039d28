"""Membership benchmark: failure detection, dissemination, load and false positives.

Simulated part (this file): the pure core driven by dpeer.sim on a virtual clock, so the figures
are protocol figures (rounds, fan-out, timeouts), not the cost of Python or gRPC. Each figure
is one function; a real-process section (daemons on loopback) can be added next to them.

    python scripts/bench_membership.py            # 10, 100, 1000 nodes, 3 seeds
    python scripts/bench_membership.py --quick    # fewer seeds, shorter loss runs
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpeer.peer.membership import (  # noqa: E402
    Effect, MemberAlive, MemberDead, MemberLeft, MemberRecord, MemberState, MembershipConfig, lan, wire_size,
)
from dpeer.peer.membership.sim_adapter import SimMember, sim_addr  # noqa: E402
from dpeer.sim.network import LinkPolicy, SimNetwork  # noqa: E402
from dpeer.sim.simulator import Simulator  # noqa: E402

WARMUP = 5.0


@dataclass
class SimRun:
    """A bootstrapped simulated cluster that records when each observer first saw each change."""

    sim: Simulator
    ids: list[str]
    config: MembershipConfig
    seen: dict[tuple[type, str], dict[str, float]] = field(default_factory=dict)
    deaths: int = 0

    def sink(self, now: float, observer: str, effect: Effect) -> None:
        """Keep the first time each observer saw each (kind, node) change."""
        if isinstance(effect, (MemberAlive, MemberDead, MemberLeft)):
            self.seen.setdefault((type(effect), effect.node_id), {}).setdefault(observer, now)
            self.deaths += isinstance(effect, MemberDead)

    def count(self, kind: type, node_id: str) -> int:
        """How many observers have seen this change."""
        return len(self.seen.get((kind, node_id), {}))

    def run_until_seen(self, kind: type, node_id: str, needed: int, limit: float, step: float = 0.02) -> None:
        """Advance until `needed` observers saw the change, or `limit` virtual seconds."""
        end = self.sim.now + limit
        while self.sim.now < end and self.count(kind, node_id) < needed:
            self.sim.run_for(step)

    def times(self, kind: type, node_id: str, since: float) -> list[float]:
        """Sorted delays from `since` until each observer saw the change."""
        return sorted(t - since for t in self.seen.get((kind, node_id), {}).values())


def build(n: int, seed: int, loss: float = 0.0, config: MembershipConfig | None = None) -> SimRun:
    """n nodes that all start knowing each other (a formed cluster), on a seeded network."""
    network = SimNetwork(random.Random(seed ^ 0x5EED), LinkPolicy(loss=loss))
    sim = Simulator(seed, network=network, size_of=wire_size)
    ids = [f"n{i:04d}" for i in range(n)]
    run = SimRun(sim, ids, config or lan())
    known = [MemberRecord(i, sim_addr(i), MemberState.ALIVE, 0) for i in ids]
    for k, node_id in enumerate(ids):
        sim.add(node_id, SimMember(node_id, run.config, seed * 1_000_003 + k, known=known, sink=run.sink))
    return run


def quantile_time(delays: list[float], fraction: float, population: int) -> float:
    """The delay by which `fraction` of `population` observers saw the change (inf if never)."""
    needed = math.ceil(fraction * population)
    return delays[needed - 1] if len(delays) >= needed else math.inf


# -- figures (simulated) ---------------------------------------------------------------------
def fig_crash_detection(n: int, seed: int) -> tuple[float, float]:
    """A SIGKILLed node: seconds until the first and until every other node marks it dead."""
    run = build(n, seed)
    run.sim.run_until(WARMUP)
    victim = run.ids[n // 2]
    run.sim.crash(victim)
    run.run_until_seen(MemberDead, victim, n - 1, 30.0)
    delays = run.times(MemberDead, victim, WARMUP)
    return delays[0], quantile_time(delays, 1.0, n - 1)


def fig_pause_detection(n: int, seed: int) -> tuple[float, float]:
    """A SIGSTOPped node: seconds until the first and until every other node marks it dead."""
    run = build(n, seed)
    run.sim.run_until(WARMUP)
    victim = run.ids[n // 2]
    run.sim.pause(victim)
    run.run_until_seen(MemberDead, victim, n - 1, 30.0)
    delays = run.times(MemberDead, victim, WARMUP)
    return delays[0], quantile_time(delays, 1.0, n - 1)


def fig_join_dissemination(n: int, seed: int) -> float:
    """A node joins through one seed: seconds until 99.99 % of the others list it alive."""
    run = build(n, seed)
    run.sim.run_until(WARMUP)
    run.sim.add("joiner", SimMember("joiner", run.config, seed, run.sim.now, seeds=[run.ids[0]], sink=run.sink))
    run.run_until_seen(MemberAlive, "joiner", math.ceil(0.9999 * n), 30.0)
    return quantile_time(run.times(MemberAlive, "joiner", WARMUP), 0.9999, n)


def fig_leave_dissemination(n: int, seed: int) -> float:
    """A node leaves gracefully: seconds until 99.99 % of the others list it left."""
    run = build(n, seed)
    run.sim.run_until(WARMUP)
    leaver = run.sim.actor(run.ids[1])
    leaver.request_leave()
    run.run_until_seen(MemberLeft, run.ids[1], math.ceil(0.9999 * (n - 1)), 30.0)
    assert leaver.left_at is not None
    return quantile_time(run.times(MemberLeft, run.ids[1], leaver.left_at), 0.9999, n - 1)


def fig_steady_load(n: int, seed: int, window: float) -> tuple[float, float]:
    """Messages and bytes sent per node per second in a quiet, formed cluster."""
    run = build(n, seed)
    run.sim.run_until(WARMUP)
    sent, sent_bytes = run.sim.stats.sent, run.sim.stats.bytes_sent
    run.sim.run_for(window)
    return (run.sim.stats.sent - sent) / n / window, (run.sim.stats.bytes_sent - sent_bytes) / n / window


def fig_false_positives(n: int, seed: int, loss: float, duration: float) -> tuple[int, float]:
    """Under random loss only: dead declarations (all false) and that count per node-hour."""
    run = build(n, seed, loss=loss)
    run.sim.run_until(duration)
    return run.deaths, run.deaths / (n * duration / 3600.0)


# -- report -----------------------------------------------------------------------------------
def median(values: list[float]) -> float:
    """The median, with inf kept (a run that never converged)."""
    return statistics.median(values)


def simulated_section(sizes: list[int], seeds: list[int], fp_sizes: list[int], fp_duration: float) -> None:
    """Print the simulated figures as markdown tables (medians over seeds)."""
    print(f"### Simulated (lan preset, seeds {seeds}, medians)\n")
    print("| nodes | kill: first dead | kill: all dead | pause: first dead | pause: all dead "
          "| join 99.99 % | leave 99.99 % | msgs/node/s | bytes/node/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        t0 = time.time()
        kill = [fig_crash_detection(n, s) for s in seeds]
        pause = [fig_pause_detection(n, s) for s in seeds]
        join = [fig_join_dissemination(n, s) for s in seeds]
        leave = [fig_leave_dissemination(n, s) for s in seeds]
        load = [fig_steady_load(n, s, 10.0) for s in seeds]
        print(
            f"| {n} | {median([k[0] for k in kill]):.2f} s | {median([k[1] for k in kill]):.2f} s "
            f"(max {max(k[1] for k in kill):.2f}) | {median([p[0] for p in pause]):.2f} s "
            f"| {median([p[1] for p in pause]):.2f} s (max {max(p[1] for p in pause):.2f}) "
            f"| {median(join):.2f} s | {median(leave):.2f} s | {median([x[0] for x in load]):.1f} "
            f"| {median([x[1] for x in load]):.0f} |",
            flush=True,
        )
        print(f"<!-- {n} nodes: {time.time() - t0:.0f} s wall -->", flush=True)
    print(f"\n### False positives under loss (lan preset, {fp_duration:.0f} simulated s per run, seeds {seeds})\n")
    print("| nodes | loss | dead declarations (all seeds) | per node-hour |")
    print("|---|---|---|---|")
    for n in fp_sizes:
        for loss in (0.01, 0.05, 0.10):
            runs = [fig_false_positives(n, s, loss, fp_duration) for s in seeds]
            total = sum(r[0] for r in runs)
            hours = len(seeds) * n * fp_duration / 3600.0
            print(f"| {n} | {loss:.0%} | {total} | {total / hours:.3f} ({hours:.1f} node-hours) |", flush=True)


def main() -> None:
    """Parse flags and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, shorter loss runs")
    parser.add_argument("--sizes", default="10,100,1000", help="cluster sizes for the detection table")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    seeds = [1] if args.quick else [1, 2, 3]
    fp_sizes = [10] if args.quick else [10, 100]
    simulated_section(sizes, seeds, fp_sizes, 120.0 if args.quick else 600.0)


if __name__ == "__main__":
    main()
