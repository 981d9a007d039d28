"""Mixed speeds (issue 41): boxes of different speeds trained with each box's share of a step by
its measured speed (`training.split: speed`, the default) against equal shares (`split: even`),
beside each box's own speed alone, in the same run.

``--cores`` gives each box its fraction of a core: "1,0.5" (the default) is box 1 on a core of its
own and box 2 at half a core; "0.6,0.6,0.3" three boxes, the third at half the others' speed. A box
below a whole core runs in a cgroup (v1 cpu controller) whose CFS quota is that fraction
(dpeer/chaos/slow_core.py); while there are no more boxes than cores, box i is pinned to core i-1.
Each arm is a fresh LocalCluster training the demo MLP (``--dim``/``--hidden``) in exact mode,
global batch ``--global-batch`` in micro-batches of ``--micro-batch``, one intra-op thread:
- alone-1 .. alone-N: one box on its placement (its own speed, no communication);
- even, speed: all boxes.
A run's speed is samples a second over the median interval between box 1's committed steps after
``--warm`` (the speed arm's shares come from speeds measured over the first steps, then a view
change). Per round: speed / even, and speed / (the sum of the alone arms), the boxes' own speeds
summed that a perfect split would reach (minus the step's sums, which no split removes). The final
digests of every arm must be equal: exact mode's bits do not depend on the split.

Needs root (cgroup) and Linux. Usage: ``python scripts/bench_mixed.py [--rounds 2] [--steps 80]
[--warm 30] [--cores 1,0.5] [--json FILE]``.
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



def placements(cores: list[float], cgroups: list[SlowCore | None]) -> list[tuple[str, list[str]]]:
    """Each box's (host, command prefix): its cgroup where it has one, pinned while boxes <= cores."""
    pin = len(cores) <= (os.cpu_count() or 1)
    out = []
    for i, group in enumerate(cgroups):
        if group is not None:
            out.append(("127.0.0.1", group.prefix(i if pin else None)))
        else:
            out.append(("127.0.0.1", ["taskset", "-c", str(i)] if pin else []))
    return out


def run_arm(arm: str, root: Path, places: list[tuple[str, list[str]]], args: argparse.Namespace) -> dict[str, Any]:
    """One arm's cluster to ``warm + steps`` steps: box 1's speed (samples/s), final digest, shares."""
    boxes = [places[int(arm.split("-")[1]) - 1]] if arm.startswith("alone-") else places
    steps = args.warm + args.steps
    config = {"training": {"steps": steps, "global_batch": args.global_batch, "micro_batch": args.micro_batch,
                           "threads": 1, "reduction": "exact", "checkpoint_every": 0, "spare_worker": False,
                           "split": "even" if arm == "even" else "speed",
                           "options": {"dim": args.dim, "hidden": args.hidden}}}
    out = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=root))
    cluster = LocalCluster(out, len(boxes), job="demo", config=config, env={"OMP_NUM_THREADS": "1"},
                           placement=lambda i: boxes[i - 1])
    reports = str(out / "n1" / "worker")
    try:
        cluster.start_all()
        deadline = time.monotonic() + 120 + steps * 5.0
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
    p.add_argument("--cores", default="1,0.5", help="each box's fraction of a core, comma-separated")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=384)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    cores = [float(c) for c in args.cores.split(",")]
    arms = [f"alone-{i + 1}" for i in range(len(cores))] + ["even", "speed"]
    root = Path(tempfile.mkdtemp(prefix="bench-mixed-"))
    cgroups: list[SlowCore | None] = []
    result: dict[str, Any] = {"load_before": os.getloadavg(), "args": vars(args) | {"json": None}, "rounds": []}
    try:
        cgroups = [SlowCore(c, f"bench{i + 1}") if c < 1 else None for i, c in enumerate(cores)]
        places = placements(cores, cgroups)
        for rnd in range(args.rounds):
            row = {}
            for arm in (arms if rnd % 2 == 0 else arms[::-1]):
                row[arm] = run_arm(arm, root, places, args)
                sps = row[arm]["samples_per_s"]
                print(f"round {rnd + 1} {arm:>8}: {f'{sps:.0f} samples/s' if sps else 'no steady steps'}, "
                      f"digest at step {row[arm]['step']} {str(row[arm]['digest'])[:16]}, "
                      f"shares of each group formed {row[arm]['shares']}", flush=True)
            result["rounds"].append(row)
    finally:
        for group in cgroups:
            if group is not None:
                group.close()
        shutil.rmtree(root, ignore_errors=True)
    result["load_after"] = os.getloadavg()
    summarize(result["rounds"], arms)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def summarize(rounds: list[dict[str, dict]], arms: list[str]) -> None:
    """Medians over rounds: each arm's samples/s, speed against even and against the own speeds' sum."""
    def med(arm: str) -> float:
        return statistics.median(r[arm]["samples_per_s"] for r in rounds)

    alone = [arm for arm in arms if arm.startswith("alone-")]
    vs_even = [r["speed"]["samples_per_s"] / r["even"]["samples_per_s"] for r in rounds]
    vs_sum = [r["speed"]["samples_per_s"] / sum(r[arm]["samples_per_s"] for arm in alone) for r in rounds]
    digests = {r[arm]["digest"] for r in rounds for arm in arms}
    print(f"\n{len(rounds)} rounds: " + ", ".join(f"{arm} {med(arm):.0f}" for arm in arms) + " samples/s")
    print(f"speed / even: {statistics.median(vs_even):.3f} [{min(vs_even):.3f}, {max(vs_even):.3f}]")
    print(f"speed / ({' + '.join(alone)}): {statistics.median(vs_sum):.3f} [{min(vs_sum):.3f}, {max(vs_sum):.3f}]")
    print(f"final digests: {'all equal' if len(digests) == 1 else f'{len(digests)} different: {sorted(digests)}'}")


if __name__ == "__main__":
    sys.exit(main())
