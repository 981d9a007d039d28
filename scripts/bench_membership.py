"""Membership benchmark: failure detection, dissemination, load and false positives.

Simulated part: the pure core driven by dpeer.sim on a virtual clock, so the figures are
protocol figures (rounds, fan-out, timeouts), not the cost of Python or gRPC.

Real-process part (--real): `dpeer start` daemons on loopback (LocalCluster): idle CPU per daemon
with 16 peers (17 daemons, no job, /proc/PID/stat utime+stime over a window), and the time from
SIGKILL / SIGSTOP of one follower until every other node's status marks it dead (5 nodes,
statuses polled every ~10 ms through one persistent client and one task per node).

    python scripts/bench_membership.py            # simulated: 10, 100, 1000 nodes, 3 seeds
    python scripts/bench_membership.py --quick    # simulated: fewer seeds, shorter loss runs
    python scripts/bench_membership.py --real --no-sim           # real processes only, ~4 min
    python scripts/bench_membership.py --real --no-sim --quick   # real processes only, < 2 min
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

from dpeer.membership import (  # noqa: E402
    Effect, SeenAlive, SeenDead, SeenLeft, MemberRecord, MemberState, MembershipConfig, lan, wire_size,
)
from dpeer.membership.sim_adapter import SimMember, sim_addr  # noqa: E402
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
        if isinstance(effect, (SeenAlive, SeenDead, SeenLeft)):
            self.seen.setdefault((type(effect), effect.node_id), {}).setdefault(observer, now)
            self.deaths += isinstance(effect, SeenDead)

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
    run.run_until_seen(SeenDead, victim, n - 1, 30.0)
    delays = run.times(SeenDead, victim, WARMUP)
    return delays[0], quantile_time(delays, 1.0, n - 1)


def fig_pause_detection(n: int, seed: int) -> tuple[float, float]:
    """A SIGSTOPped node: seconds until the first and until every other node marks it dead."""
    run = build(n, seed)
    run.sim.run_until(WARMUP)
    victim = run.ids[n // 2]
    run.sim.pause(victim)
    run.run_until_seen(SeenDead, victim, n - 1, 30.0)
    delays = run.times(SeenDead, victim, WARMUP)
    return delays[0], quantile_time(delays, 1.0, n - 1)


def fig_join_dissemination(n: int, seed: int) -> float:
    """A node joins through one seed: seconds until 99.99 % of the others list it alive."""
    run = build(n, seed)
    run.sim.run_until(WARMUP)
    run.sim.add("joiner", SimMember("joiner", run.config, seed, run.sim.now, seeds=[run.ids[0]], sink=run.sink))
    run.run_until_seen(SeenAlive, "joiner", math.ceil(0.9999 * n), 30.0)
    return quantile_time(run.times(SeenAlive, "joiner", WARMUP), 0.9999, n)


def fig_leave_dissemination(n: int, seed: int) -> float:
    """A node leaves gracefully: seconds until 99.99 % of the others list it left."""
    run = build(n, seed)
    run.sim.run_until(WARMUP)
    leaver = run.sim.actor(run.ids[1])
    leaver.request_leave()
    run.run_until_seen(SeenLeft, run.ids[1], math.ceil(0.9999 * (n - 1)), 30.0)
    assert leaver.left_at is not None
    return quantile_time(run.times(SeenLeft, run.ids[1], leaver.left_at), 0.9999, n - 1)


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


# -- figures (real processes) -----------------------------------------------------------------
# Daemons on loopback through dpeer.launch.cluster.LocalCluster; the process hygiene, status
# polling and formation checks are shared with scripts/bench_agreement.py.
REAL_TRIAL_TIMEOUT = 15.0
REAL_POLL = 0.01


def _agreement():  # noqa: ANN202 - the sibling script, imported only for the real section
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_agreement

    return bench_agreement


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds, from /proc/PID/stat."""
    import os

    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def real_idle_cpu(n: int, window: float, settle: float) -> dict:
    """Per-daemon CPU (% of one core) of a formed, idle cluster of n daemons; nothing polls them
    during the window. Returns leader and followers' figures."""
    import asyncio

    ba = _agreement()
    voters = min(n, ba.DEFAULT_MAX_VOTERS)
    with ba.local_cluster(n) as cluster:
        pollers = ba.Pollers(cluster)
        t = time.monotonic()
        try:
            docs = await ba.wait_stable(pollers, n, voters)
            formed = time.monotonic() - t
            await asyncio.sleep(settle)
            docs = await ba.wait_stable(pollers, n, voters)
        finally:
            await pollers.close()
        doc = next(d for d in docs.values() if d is not None)
        leader, voter_ids = doc["leader"], set(doc.get("voters", []))
        pids = {node.node_id: node.proc.pid for node in cluster.nodes}
        before = {i: proc_cpu_seconds(p) for i, p in pids.items()}
        t0 = time.monotonic()
        await asyncio.sleep(window)
        after = {i: proc_cpu_seconds(p) for i, p in pids.items()}
        elapsed = time.monotonic() - t0
        loadavg = Path("/proc/loadavg").read_text().split()[:3]
    pct = {i: 100.0 * (after[i] - before[i]) / elapsed for i in pids}
    followers = sorted(v for i, v in pct.items() if i != leader)
    voters_pct = sorted(v for i, v in pct.items() if i != leader and i in voter_ids)
    learners_pct = sorted(v for i, v in pct.items() if i != leader and i not in voter_ids)
    return {"nodes": n, "leader": leader, "leader_pct": pct[leader], "followers": followers,
            "voter_followers": voters_pct, "learners": learners_pct,
            "window": elapsed, "formed_s": formed, "loadavg": loadavg}


async def real_detection(n: int, trials: int, settle: float) -> dict:
    """SIGKILL and SIGSTOP one follower per trial; seconds until the first and until every other
    node's status lists it dead. The victim is restarted (KILL) or SIGCONTed (STOP) and the
    cluster re-forms before the next trial; victims rotate over the followers."""
    import asyncio
    import math
    import signal

    ba = _agreement()
    voters = min(n, ba.DEFAULT_MAX_VOTERS)
    out: dict = {"kill": [], "stop": [], "idle": None}
    with ba.local_cluster(n) as cluster:
        pollers = ba.Pollers(cluster)
        try:
            docs = await ba.wait_stable(pollers, n, voters)
            for kind, sig in (("kill", signal.SIGKILL), ("stop", signal.SIGSTOP)):
                for trial in range(trials):
                    docs = await ba.wait_stable(pollers, n, voters)
                    await asyncio.sleep(settle)
                    docs = await ba.wait_stable(pollers, n, voters)
                    leader = next(d for d in docs.values() if d is not None)["leader"]
                    followers = [x.node_id for x in cluster.nodes if x.node_id != leader]
                    victim = followers[trial % len(followers)]
                    observers = [x.node_id for x in cluster.nodes if x.node_id != victim]
                    seen: dict[str, float] = {}
                    done = asyncio.Event()

                    async def watch(obs: str, t0: float) -> None:
                        while not done.is_set():
                            doc = await pollers.status(obs, timeout=0.5)
                            if doc is not None and ba.member_states(doc).get(victim) == "dead":
                                seen.setdefault(obs, time.perf_counter() - t0)
                                if len(seen) == len(observers):
                                    done.set()
                            await asyncio.sleep(REAL_POLL)

                    t0 = time.perf_counter()
                    cluster.kill(cluster.node(victim), sig)
                    tasks = [asyncio.create_task(watch(o, t0)) for o in observers]
                    try:
                        await asyncio.wait_for(done.wait(), REAL_TRIAL_TIMEOUT)
                    except asyncio.TimeoutError:
                        pass
                    done.set()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    if kind == "kill":
                        cluster.start(cluster.node(victim))
                    else:
                        cluster.kill(cluster.node(victim), signal.SIGCONT)
                    times = [seen.get(o, math.inf) for o in observers]
                    out[kind].append({"victim": victim, "first": min(times), "all": max(times)})
                    print(f"  real {kind} trial {trial + 1}: victim {victim}, first dead {min(times):.3f} s, "
                          f"all dead {max(times):.3f} s", file=sys.stderr, flush=True)
        finally:
            await pollers.close()
    return out


def real_section(args: argparse.Namespace) -> None:
    """Run the real-process figures and print them as markdown."""
    import asyncio
    import os

    ba = _agreement()
    ba.install_cleanup()
    window = args.idle_window or (15.0 if args.quick else 30.0)
    trials = args.trials or (4 if args.quick else 9)
    t0 = time.time()
    try:
        det = None if args.idle_only else asyncio.run(real_detection(5, trials, 1.0))
        idle = asyncio.run(real_idle_cpu(args.idle_nodes, window, 3.0 if args.quick else 5.0))
    finally:
        ba._stop_everything()
    print(f"\n### Real processes (daemons on loopback, lan preset; {os.cpu_count()} cores)\n")
    print(f"Idle CPU, {idle['nodes']} daemons ({idle['nodes'] - 1} peers each), no job, nothing polling, "
          f"{idle['window']:.0f} s window (formed in {idle['formed_s']:.1f} s; load average {' '.join(idle['loadavg'])}):\n")
    print("| daemon | CPU, % of one core | vs 1 % target |")
    print("|---|---|---|")
    f = idle["followers"]
    print(f"| leader ({idle['leader']}) | {idle['leader_pct']:.2f} % | {idle['leader_pct']:.2f}x |")
    print(f"| followers, median of {len(f)} | {median(f):.2f} % | {median(f):.2f}x |")
    print(f"| followers, max | {max(f):.2f} % | {max(f):.2f}x |")
    for label, part in (("voting followers", idle["voter_followers"]), ("learners", idle["learners"])):
        if part:
            print(f"| {label}, median of {len(part)} (max) | {median(part):.2f} % ({max(part):.2f}) | {median(part):.2f}x |")
    print(f"| all {idle['nodes']} together | {idle['leader_pct'] + sum(f):.1f} % | |")
    if det is not None:
        _print_detection(det, trials)
    print(f"\n<!-- real section: {time.time() - t0:.0f} s wall; raw: {det} {idle} -->")


def _print_detection(det: dict, trials: int) -> None:
    """The SIGKILL and SIGSTOP detection table."""
    print(f"\nFailure detection, 5 daemons, {trials} trials each (a follower is the victim; "
          f"status polled every {REAL_POLL * 1e3:.0f} ms per node; medians, max in brackets):\n")
    print("| signal | first node marks it dead | every other node marks it dead | target | median vs target |")
    print("|---|---|---|---|---|")
    for kind, target in (("kill", 1.0), ("stop", 3.0)):
        rows = det[kind]
        first = [r["first"] for r in rows]
        every = [r["all"] for r in rows]
        print(f"| SIG{kind.upper()} | {median(first):.3f} s ({max(first):.3f}) | {median(every):.3f} s "
              f"({max(every):.3f}) | {target:.0f} s | {median(every) / target:.2f}x |")


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
    parser.add_argument("--real", action="store_true", help="also run the real-process section (daemons on loopback)")
    parser.add_argument("--no-sim", action="store_true", help="skip the simulated section")
    parser.add_argument("--idle-nodes", type=int, default=17, help="daemons for the idle CPU figure (16 peers each)")
    parser.add_argument("--idle-only", action="store_true", help="real section: idle CPU only, no detection trials")
    parser.add_argument("--idle-window", type=float, help="seconds of idle CPU measurement (default 30, quick 15)")
    parser.add_argument("--trials", type=int, help="SIGKILL and SIGSTOP trials each, 5 nodes (default 9, quick 4)")
    args = parser.parse_args()
    if not args.no_sim:
        sizes = [int(x) for x in args.sizes.split(",")]
        seeds = [1] if args.quick else [1, 2, 3]
        fp_sizes = [10] if args.quick else [10, 100]
        simulated_section(sizes, seeds, fp_sizes, 120.0 if args.quick else 600.0)
    if args.real:
        real_section(args)


if __name__ == "__main__":
    main()
