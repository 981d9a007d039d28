"""`dpeer demo`: a local cluster on loopback training the demo job, shown live in the terminal.

With --chaos, a seeded schedule kills a node (SIGKILL of its daemon and worker) and restarts it
on its data dir a little later, never taking down more nodes than a quorum allows; each
recovery is measured from the kill to the survivors' next committed step, and each rejoin from
the restart to the restarted node training again.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpeer.peer.cluster import LocalCluster
from dpeer.peer.config import TrainingConfig

REFRESH = 0.5


@dataclass
class Fault:
    """One chaos kill and what followed it."""

    node: str
    at: float
    step: int
    recovered_s: float | None = None
    restarted_at: float | None = None
    rejoined_s: float | None = None


@dataclass
class Chaos:
    """A seeded schedule: a kill every `every` seconds, the node restarted `down_for` seconds later."""

    rng: random.Random
    every: float = 12.0
    down_for: float = 4.0
    next_at: float = 0.0
    faults: list[Fault] = field(default_factory=list)

    def due(self, now: float) -> bool:
        """True when it is time for the next kill."""
        return now >= self.next_at


def _train(doc: dict | None) -> dict[str, Any]:
    return (doc or {}).get("train") or {}


def render(docs: dict[str, dict | None], started: float, steps: int, faults: list[Fault], rate: float) -> str:
    """The live screen: one row per node, then the chaos log."""
    leader = next((d["leader"] for d in docs.values() if d and d.get("leader")), None)
    gen = max((d["group"]["generation"] for d in docs.values() if d and d.get("group")), default=0)
    step = max((_train(d).get("step", 0) for d in docs.values()), default=0)
    lines = [f"dpeer demo  {time.monotonic() - started:6.1f}s  leader {leader}  generation {gen}  "
             f"step {step}/{steps}  {rate:5.1f} steps/s", "",
             f"{'NODE':<6}{'STATE':<10}{'ROLE':<10}{'RANK':<8}{'STEP':>7}{'LOSS':>9}  DIGEST"]
    for node_id, d in sorted(docs.items()):
        if d is None:
            lines.append(f"{node_id:<6}{'down':<10}")
            continue
        g, t = d.get("group"), _train(d)
        rank = f"{g['rank']}/{g['world_size']}" if g else "-"
        loss = f"{t['loss']:.4f}" if t else "-"
        lines.append(f"{node_id:<6}{'up':<10}{d['role']:<10}{rank:<8}{t.get('step', '-'):>7}{loss:>9}  "
                     f"{t.get('params_digest', '')[:12]}")
    for f in faults[-8:]:
        rec = f"recovered in {f.recovered_s:.2f}s" if f.recovered_s is not None else "recovering..."
        rej = f", back in {f.rejoined_s:.2f}s after restart" if f.rejoined_s is not None else ""
        lines.append(f"  killed {f.node} at step {f.step}: {rec}{rej}")
    return "\n".join(lines)


async def _chaos_step(cluster: LocalCluster, chaos: Chaos, docs: dict, now: float) -> None:
    for f in chaos.faults:
        node = cluster.node(f.node)
        survivors = [d for n, d in docs.items() if n != f.node and d]
        if f.recovered_s is None and any(_train(d).get("step", -1) > f.step for d in survivors):
            f.recovered_s = now - f.at
        if f.restarted_at is None and now - f.at >= chaos.down_for:
            cluster.start(node)
            f.restarted_at = now
        back = docs.get(f.node)
        if f.restarted_at is not None and f.rejoined_s is None and back and back.get("group") \
                and _train(back).get("step", -1) >= max(_train(d).get("step", 0) for d in survivors) - 1:
            f.rejoined_s = now - f.restarted_at
    down = [n for n in cluster.nodes if not n.running]
    if chaos.due(now) and len(down) < (len(cluster.nodes) - 1) // 2 + (len(cluster.nodes) == 2):
        victim = chaos.rng.choice([n for n in cluster.nodes if n.running])
        step = max((_train(d).get("step", 0) for d in docs.values()), default=0)
        cluster.kill(victim, signal.SIGKILL)
        chaos.faults.append(Fault(victim.node_id, now, step))
        chaos.next_at = now + chaos.every


async def _run(cluster: LocalCluster, steps: int, chaos: Chaos | None) -> int:
    started = time.monotonic()
    tty = sys.stdout.isatty()
    history: list[tuple[float, int]] = []
    if chaos is not None:
        chaos.next_at = started + chaos.every
    while True:
        docs = await cluster.statuses(timeout=1.0)
        docs.update({n.node_id: None for n in cluster.nodes if not n.running})
        now = time.monotonic()
        step = max((_train(d).get("step", 0) for d in docs.values()), default=0)
        history = [(t, s) for t, s in history if now - t < 5.0] + [(now, step)]
        rate = (history[-1][1] - history[0][1]) / max(1e-9, history[-1][0] - history[0][0])
        if chaos is not None:
            await _chaos_step(cluster, chaos, docs, now)
        screen = render(docs, started, steps, chaos.faults if chaos else [], rate)
        print(("\x1b[H\x1b[2J" + screen) if tty else screen.splitlines()[0], flush=True)
        if all(d and d.get("worker") and d["worker"]["done"] for d in docs.values()):
            print(screen if not tty else "", "\ntraining finished: every replica ran all steps", sep="")
            return 0
        await asyncio.sleep(REFRESH)


def run_demo(args: argparse.Namespace) -> int:
    """Start the cluster, show it until the job finishes (or Ctrl-C), then stop every node."""
    if args.nodes < 1 or args.nodes > 9:
        raise ValueError("--nodes must be between 1 and 9")
    steps = args.steps or TrainingConfig().steps
    if steps < 1:
        raise ValueError("--steps must be positive")
    root = args.dir or Path(tempfile.mkdtemp(prefix="dpeer-demo-"))
    cluster = LocalCluster(root, args.nodes, job="demo", base_port=args.base_port,
                           config={"training": {"steps": steps}})
    print(f"starting {args.nodes} nodes on 127.0.0.1 (data and logs in {root}); Ctrl-C stops them", flush=True)
    chaos = Chaos(random.Random(args.seed)) if args.chaos else None
    cluster.start_all()
    try:
        code = asyncio.run(_run(cluster, steps, chaos))
    except KeyboardInterrupt:
        code = 130
    finally:
        cluster.stop_all()
    if chaos is not None:
        rec = [f.recovered_s for f in chaos.faults if f.recovered_s is not None]
        if rec:
            print(f"{len(chaos.faults)} kills; median recovery {sorted(rec)[len(rec) // 2]:.2f}s")
    return code
