"""Mixed speeds (issue 41): two boxes of which one computes at half speed, trained with each box's
share of a step by its measured speed (`training.split: speed`, the default) against equal shares
(`split: even`), beside each box's own speed alone, in the same run.

Box 1 runs on core 0; box 2 on core 1 in a cgroup (v1 cpu controller) whose CFS quota is
``--slow`` of a core (0.5: half speed). Each arm is a fresh LocalCluster training the demo MLP
(``--dim``/``--hidden``) in exact mode, global batch ``--global-batch`` in micro-batches of
``--micro-batch``, one intra-op thread:
- alone-fast, alone-slow: one box on its placement (its own speed, no communication);
- even, speed: both boxes.
A run's speed is samples a second over the median interval between box 1's committed steps after
``--warm`` (the speed arm's shares come from speeds measured over the first steps, then a view
change). Per round: speed / even, and speed / (alone-fast + alone-slow), the sum of the boxes' own
speeds that a perfect split would reach (minus the step's sums, which no split removes). The final
digests of every arm must be equal: exact mode's bits do not depend on the split.

Needs root (cgroup) and Linux. Usage: ``python scripts/bench_mixed.py [--rounds 2] [--steps 80]
[--warm 30] [--slow 0.5] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_steady import step_time  # noqa: E402

from dpeer.channel.local import read_reports  # noqa: E402
from dpeer.chaos.slow_core import SlowCore  # noqa: E402
from dpeer.launch.cluster import LocalCluster  # noqa: E402

ARMS = ("alone-fast", "alone-slow", "even", "speed")
def run_arm(arm: str, root: Path, slow: SlowCore, args: argparse.Namespace) -> dict[str, Any]:
    """One arm's cluster to ``warm + steps`` steps: box 1's speed (samples/s) and final digest."""
    fast = ("127.0.0.1", ["taskset", "-c", "0"])
    places = {"alone-fast": [fast], "alone-slow": [("127.0.0.1", slow.prefix(1))]}.get(
        arm, [fast, ("127.0.0.1", slow.prefix(1))])
    steps = args.warm + args.steps
    config = {"training": {"steps": steps, "global_batch": args.global_batch, "micro_batch": args.micro_batch,
                           "threads": 1, "reduction": "exact", "checkpoint_every": 0, "spare_worker": False,
                           "split": "even" if arm == "even" else "speed",
                           "options": {"dim": args.dim, "hidden": args.hidden}}}
    out = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=root))
    cluster = LocalCluster(out, len(places), job="demo", config=config, env={"OMP_NUM_THREADS": "1"},
                           placement=lambda i: places[i - 1])
    reports = str(out / "n1" / "worker")
    try:
        cluster.start_all()
        deadline = time.monotonic() + 120 + steps * 3.0
        while time.monotonic() < deadline:
            done = [r for r in read_reports(reports, "n1") if r.get("kind") == "progress"]
            if done and done[-1]["step"] >= steps:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{arm} did not reach step {steps}: {cluster.tail(cluster.nodes[0])}")
    finally:
        cluster.stop_all()
    records = read_reports(reports, "n1")
    progress = [r for r in records if r.get("kind") == "progress"]
    st = step_time(progress, args.warm)
    shares = [r.get("shares") for r in records if r.get("kind") == "formed"]
    return {"samples_per_s": args.global_batch / st if st else None, "digest": progress[-1].get("digest"),
            "step": progress[-1]["step"], "shares": shares}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warm", type=int, default=30)
    p.add_argument("--slow", type=float, default=0.5)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=384)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-mixed-"))
    slow = SlowCore(args.slow)
    result: dict[str, Any] = {"load_before": os.getloadavg(), "args": vars(args) | {"json": None}, "rounds": []}
    try:
        for rnd in range(args.rounds):
            row = {}
            for arm in (ARMS if rnd % 2 == 0 else ARMS[::-1]):
                row[arm] = run_arm(arm, root, slow, args)
                sps = row[arm]["samples_per_s"]
                print(f"round {rnd + 1} {arm:>10}: {f'{sps:.0f} samples/s' if sps else 'no steady steps'}, "
                      f"digest at step {row[arm]['step']} {str(row[arm]['digest'])[:16]}, "
                      f"shares of each group formed {row[arm]['shares']}", flush=True)
            result["rounds"].append(row)
    finally:
        slow.close()
        shutil.rmtree(root, ignore_errors=True)
    result["load_after"] = os.getloadavg()
    summarize(result["rounds"])
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def summarize(rounds: list[dict[str, dict]]) -> None:
    """Medians over rounds: each arm's samples/s, speed against even and against the own speeds' sum."""
    def med(arm: str) -> float:
        return statistics.median(r[arm]["samples_per_s"] for r in rounds)

    vs_even = [r["speed"]["samples_per_s"] / r["even"]["samples_per_s"] for r in rounds]
    vs_sum = [r["speed"]["samples_per_s"] / (r["alone-fast"]["samples_per_s"] + r["alone-slow"]["samples_per_s"])
              for r in rounds]
    digests = {r[arm]["digest"] for r in rounds for arm in ARMS}
    print(f"\n{len(rounds)} rounds: " + ", ".join(f"{arm} {med(arm):.0f}" for arm in ARMS) + " samples/s")
    print(f"speed / even: {statistics.median(vs_even):.3f} [{min(vs_even):.3f}, {max(vs_even):.3f}]")
    print(f"speed / (alone-fast + alone-slow): {statistics.median(vs_sum):.3f} [{min(vs_sum):.3f}, {max(vs_sum):.3f}]")
    print(f"final digests: {'all equal' if len(digests) == 1 else f'{len(digests)} different: {sorted(digests)}'}")


if __name__ == "__main__":
    sys.exit(main())
