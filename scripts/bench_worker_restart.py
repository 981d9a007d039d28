"""A crashed worker, with and without the warm spare (issue 19): SIGKILL one box's worker (its
daemon lives on) and time until that box takes part in a committed step again, in one run,
alternating `training.spare_worker: true` and `false` clusters, beside the floor a fresh worker
cannot beat: a bare `python -c "import torch"` (and with torch._dynamo, which the optimizer's
first step imports) timed on the same box in the same run.

Each trial: a 2-box LocalCluster trains the demo job; once both train together (and, with the
spare on, n2's spare is up), SIGKILL n2's worker; the figure is the time from the kill to n2's
new worker reporting a committed step, split at its "built" and "formed" reports.

    python scripts/bench_worker_restart.py [--trials 3] [--json FILE]

Every process it starts is its own child, stopped on exit; OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpeer.channel.local import read_reports  # noqa: E402
from dpeer.launch.cluster import LocalCluster  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recovery_common import import_floor  # noqa: E402

ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TRAINING = {"steps": 1000000, "global_batch": 16, "micro_batch": 8, "checkpoint_every": 0}


def reports(cluster: LocalCluster, node: str) -> list[dict[str, Any]]:
    return read_reports(str(cluster.node(node).data_dir / "worker"), node)


def cpu_ticks(pid: int) -> int:
    """utime + stime of pid, in clock ticks (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


async def idle(pid: int, timeout: float = 120.0) -> None:
    """Wait until pid used no CPU for half a second (the spare has imported and waits on its pipe)."""
    deadline, last = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        now = cpu_ticks(pid)
        if now == last:
            return
        last = now
        await asyncio.sleep(0.5)
    raise TimeoutError(f"spare {pid} still busy after {timeout:.0f}s")


async def trial(root: Path, spare: bool) -> dict[str, Any]:
    """One cluster, one kill of n2's worker; the phases of its replacement."""
    cluster = LocalCluster(root, 2, job="demo", env=dict(ENV),
                           config={"training": {**TRAINING, "spare_worker": spare}})
    try:
        cluster.start_all()
        n2 = cluster.node("n2")

        def both_train(docs: dict) -> bool:
            return all(d and (d.get("group") or {}).get("world_size") == 2 and (d.get("train") or {}).get("step", 0) > 20
                       and (not spare or d["worker"].get("spare_pid")) for d in docs.values())
        await cluster.wait_for(both_train, 300, "both boxes training (and the spare up)")
        doc = await cluster.status(n2)
        assert doc is not None
        if spare:  # a spare still importing is no spare yet: wait until it idles on its pipe
            await idle(doc["worker"]["spare_pid"])
        victim = doc["worker"]["pid"]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)

        def back() -> dict[str, float] | None:
            phases: dict[str, float] = {}
            for r in reports(cluster, "n2"):
                if r.get("t", 0) > killed_at and r.get("kind") in ("built", "formed", "progress"):
                    phases.setdefault(r["kind"], r["t"] - killed_at)
                    if r["kind"] == "built":
                        phases.setdefault("build_s", r.get("build_s", 0.0))
            return phases if "progress" in phases else None
        deadline = time.monotonic() + 300
        while (phases := back()) is None:
            assert time.monotonic() < deadline, "n2 never trained again"
            await asyncio.sleep(0.02)
        return {"spare": spare, "job_build_s": phases.get("build_s"), "kill_to_built_s": phases.get("built"), "kill_to_formed_s": phases.get("formed"),
                "kill_to_step_s": phases["progress"]}
    finally:
        cluster.stop_all()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=3, help="kills per mode (modes alternate)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    floor = import_floor()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dpeer-bench-restart-") as tmp:
        for i in range(args.trials):
            for spare in (True, False):
                row = asyncio.run(trial(Path(tmp) / f"t{i}-{'spare' if spare else 'fresh'}", spare))
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f}; floor (same run): import torch {floor['torch_wall_s']:.2f} s wall / "
          f"{floor['torch_cpu_s']:.2f} CPU-s, + torch._dynamo {floor['torch+dynamo_wall_s']:.2f} s / "
          f"{floor['torch+dynamo_cpu_s']:.2f} CPU-s")
    print("| worker kill -> | built | formed | committed step (median) | all |")
    print("|---|---|---|---|---|")
    for spare in (True, False):
        mine = [r for r in rows if r["spare"] is spare]
        med = {k: statistics.median([r[k] for r in mine if r[k] is not None] or [float("nan")])
               for k in ("kill_to_built_s", "kill_to_formed_s", "kill_to_step_s")}
        every = ", ".join(f"{r['kill_to_step_s']:.2f}" for r in mine)
        print(f"| {'warm spare' if spare else 'fresh process'} | {med['kill_to_built_s']:.2f} s | "
              f"{med['kill_to_formed_s']:.2f} s | {med['kill_to_step_s']:.2f} s | {every} |")
    if args.json:
        args.json.write_text(json.dumps({"floor": floor, "trials": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
