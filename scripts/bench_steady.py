"""Steady step time at sizes people train (issue 37): dpeer (fast and exact reduction) against the
baseline a user would otherwise pick, torchrun with DistributedDataParallel on the same model and
data, on this machine, in the same run.

Each size is the demo MLP (``dpeer.trainer.demo``) with ``dim`` and ``hidden`` set: 5M is 256/2048
(4.74M parameters), 25M is 256/4900 (25.3M); ``lm`` is examples/lm/train.py, a script job of the
user's own loop with 2 DataLoader workers a rank (its DDP baseline: scripts/ddp_lm.py). Every arm trains 2 ranks, one intra-op thread each,
global batch 64 in micro-batches of 32 (one per rank and step), gloo on loopback:
- floor: one process, no communication, one rank's share of each step (scripts/ddp_demo.py --floor);
- ddp: ``torchrun --standalone --nproc-per-node 2 scripts/ddp_demo.py``;
- fast, exact: two ``dpeer start --job demo`` daemons with ``training.reduction`` set.
Arms run one after the other, their order reversed every round. A run's step time is the median
interval between its rank 0's committed steps after the first ``--warm``; per round, the ratio of
each dpeer arm's step time to that round's ddp step time. Peak RSS is each training process's
VmHWM (every rank's, the largest reported), sampled while it runs.

Usage: ``python scripts/bench_steady.py [--sizes 5M,25M] [--rounds 3] [--steps 230] [--warm 30]
[--arms floor,ddp,fast,exact] [--json FILE]``. Prints one line per run and a table per size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recovery_common import descendants, read_jsonl  # noqa: E402

from dpeer.channel.local import read_reports  # noqa: E402
from dpeer.launch.cluster import LocalCluster  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"5M": (256, 2048), "25M": (256, 4900), "lm": (0, 0)}
LM_JOB = ROOT / "examples" / "lm" / "train.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
GLOBAL_BATCH, MICRO_BATCH = 64, 32


def vm_hwm_mb(pid: int) -> float:
    """A process's peak resident set so far (VmHWM), in MB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Peak:
    """The largest VmHWM seen per process below the given tops (sampled by `sample`)."""

    def __init__(self) -> None:
        self.by_pid: dict[int, float] = {}

    def sample(self, tops: list[int], skip_tops: bool) -> None:
        for top in tops:
            for pid in descendants(top)[1 if skip_tops else 0:]:
                self.by_pid[pid] = max(self.by_pid.get(pid, 0.0), vm_hwm_mb(pid))

    def training(self, at_least_mb: float = 150.0) -> list[float]:
        """The peaks of the processes that imported torch (a daemon or an agent stays far below)."""
        return sorted(v for v in self.by_pid.values() if v >= at_least_mb)


def step_time(records: list[dict], warm: int) -> float | None:
    """Median interval between consecutive committed steps after the first `warm`."""
    pts = sorted((r["step"], r["t"]) for r in records if r.get("step", 0) > warm)
    gaps = [b[1] - a[1] for a, b in zip(pts, pts[1:]) if b[0] == a[0] + 1]
    return statistics.median(gaps) if len(gaps) >= 10 else None


def run_script(out: Path, dim: int, hidden: int, steps: int, floor: bool) -> tuple[list[dict], list[float]]:
    """The DDP baseline under torchrun (or the floor, alone): rank 0's records and every rank's peak."""
    common = [str(ROOT / "scripts" / "ddp_demo.py"), "--out", str(out), "--steps", str(steps), "--dim", str(dim),
              "--hidden", str(hidden), "--global-batch", str(GLOBAL_BATCH), "--micro-batch", str(MICRO_BATCH)]
    if not dim:  # the lm example
        common = [str(ROOT / "scripts" / "ddp_lm.py"), "--out", str(out), "--steps", str(steps),
                  "--global-batch", str(GLOBAL_BATCH), "--micro-batch", str(MICRO_BATCH)]
    if floor:
        cmd = [sys.executable, *common, "--floor"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *common]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = Peak()
    while proc.poll() is None:
        peak.sample([proc.pid], skip_tops=False)
        time.sleep(0.25)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} failed: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
    return read_jsonl(out / "rank0.jsonl"), peak.training()


def run_dpeer(out: Path, dim: int, hidden: int, steps: int, reduction: str) -> tuple[list[dict], list[float]]:
    """Two daemons training the demo job to `steps`: n1's progress records and every worker's peak."""
    options = {"dim": dim, "hidden": hidden} if dim else {"eval_every": 10 ** 9}
    config = {"training": {"steps": steps, "global_batch": GLOBAL_BATCH, "micro_batch": MICRO_BATCH,
                           "threads": 1, "reduction": reduction, "checkpoint_every": 0, "options": options}}
    cluster = LocalCluster(out, 2, job="demo" if dim else str(LM_JOB), config=config, env={"OMP_NUM_THREADS": "1"})
    peak = Peak()
    reports = str(out / "n1" / "worker")  # n1's reports, as long as its daemon keeps them (read_reports)
    try:
        cluster.start_all()
        deadline = time.monotonic() + 60 + steps * 2.0
        while time.monotonic() < deadline:
            peak.sample([n.proc.pid for n in cluster.nodes], skip_tops=True)
            done = [r for r in read_reports(reports, "n1") if r.get("kind") == "progress"]
            if done and done[-1]["step"] >= steps:
                break
            time.sleep(0.25)
        else:
            raise RuntimeError(f"dpeer {reduction} did not reach step {steps}: {cluster.tail(cluster.nodes[0])}")
    finally:
        cluster.stop_all()
    records, world = [], 0
    for r in read_reports(reports, "n1"):  # only steps committed by both boxes together
        world = r.get("world", world) if r.get("kind") == "formed" else world
        if r.get("kind") == "progress" and world == 2:
            records.append(r)
    return records, peak.training()


def run_arm(arm: str, root: Path, dim: int, hidden: int, steps: int) -> tuple[list[dict], list[float]]:
    out = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=root))
    if arm in ("floor", "ddp"):
        return run_script(out, dim, hidden, steps, floor=arm == "floor")
    return run_dpeer(out, dim, hidden, steps, arm)


def summarize(size: str, rounds: list[dict[str, dict]], arms: list[str]) -> dict[str, Any]:
    """Per arm: median steps/s and step time; per dpeer arm, the per-round ratios to ddp; peak RSS."""
    table: dict[str, Any] = {}
    for arm in arms:
        times = [r[arm]["step_s"] for r in rounds if r.get(arm, {}).get("step_s")]
        ratios = [r[arm]["step_s"] / r["ddp"]["step_s"] for r in rounds
                  if r.get(arm, {}).get("step_s") and r.get("ddp", {}).get("step_s")]
        rss = [max(r[arm]["rss_mb"]) for r in rounds if r.get(arm, {}).get("rss_mb")]
        table[arm] = {"steps_per_s": 1 / statistics.median(times) if times else None,
                      "step_ms": 1e3 * statistics.median(times) if times else None,
                      "vs_ddp": statistics.median(ratios) if ratios else None,
                      "vs_ddp_range": [min(ratios), max(ratios)] if ratios else None,
                      "peak_rss_mb": max(rss) if rss else None}
    print(f"\n{size}: {len(rounds)} rounds")
    print(f"{'arm':>6} {'steps/s':>8} {'step ms':>8} {'vs ddp (median [min, max] of rounds)':>38} {'peak RSS MB':>12}")
    for arm, row in table.items():
        vs = (f"{row['vs_ddp']:.3f} [{row['vs_ddp_range'][0]:.3f}, {row['vs_ddp_range'][1]:.3f}]"
              if row["vs_ddp"] is not None else "-")
        sps = f"{row['steps_per_s']:.1f}" if row["steps_per_s"] else "-"
        ms = f"{row['step_ms']:.1f}" if row["step_ms"] else "-"
        rss = f"{row['peak_rss_mb']:.0f}" if row["peak_rss_mb"] else "-"
        print(f"{arm:>6} {sps:>8} {ms:>8} {vs:>38} {rss:>12}")
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="5M,25M")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=230)
    p.add_argument("--warm", type=int, default=30)
    p.add_argument("--arms", default="floor,ddp,fast,exact")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    arms = args.arms.split(",")
    if "ddp" not in arms:
        p.error("--arms must include ddp: every ratio is against it")
    root = Path(tempfile.mkdtemp(prefix="bench-steady-"))
    result: dict[str, Any] = {"load_before": os.getloadavg(), "sizes": {}}
    try:
        for size in args.sizes.split(","):
            dim, hidden = SIZES[size]
            rounds = []
            for rnd in range(args.rounds):
                row: dict[str, dict] = {}
                for arm in (arms if rnd % 2 == 0 else arms[::-1]):
                    records, rss = run_arm(arm, root, dim, hidden, args.warm + args.steps)
                    row[arm] = {"step_s": step_time(records, args.warm), "rss_mb": rss}
                    st = row[arm]["step_s"]
                    print(f"{size} round {rnd + 1} {arm:>5}: {f'{1 / st:.1f} steps/s' if st else 'no steady steps'}, "
                          f"peak RSS {', '.join(f'{v:.0f}' for v in rss)} MB", flush=True)
                rounds.append(row)
            result["sizes"][size] = {"dim": dim, "hidden": hidden, "rounds": rounds,
                                     "table": summarize(size, rounds, arms)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
