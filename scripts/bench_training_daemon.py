"""CPU of the dpeer daemons beside a training job: two boxes of the demo job on loopback, unpinned.

Prints, per box, the daemon's and the worker's CPU in ms per second of steady training, and the
steps per second, for each checkpoint interval given: the daemon's share is what dpeer costs a
training box beyond the job itself. Run it from two checkouts to compare builds.

    python scripts/bench_training_daemon.py --ckpt-every 100,1000000 --window 20
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from recovery_common import cpu_seconds, descendants  # noqa: E402
from recovery_dpeer import DpeerSide  # noqa: E402

SETTLE_LIMIT_S = 120.0


def tree_cpu(pids: list[int]) -> float:
    """CPU seconds of the processes still running among pids."""
    return sum(c for c in map(cpu_seconds, pids) if c is not None)


def measure(ckpt_every: int, window: float) -> dict:
    """Start two boxes, wait until both train together, and measure `window` seconds."""
    root = Path(tempfile.mkdtemp(prefix="dpeer-daemon-cpu-"))
    side = DpeerSide(root, ckpt_every, nodes=["n1", "n2"])
    try:
        side.start_all()
        t0 = time.time()
        while not side.settled(t0):
            if time.time() - t0 > SETTLE_LIMIT_S:
                raise RuntimeError(f"the two boxes did not train together within {SETTLE_LIMIT_S:.0f} s; "
                                   f"logs under {root}")
            time.sleep(0.5)
        time.sleep(3.0)
        boxes = {n: (pid, descendants(pid)[1:]) for n, pid in side.tops().items()}
        before = {n: (tree_cpu([p]), tree_cpu(kids)) for n, (p, kids) in boxes.items()}
        step0 = side.steady_records("n1")[-1][1]
        time.sleep(window)
        after = {n: (tree_cpu([p]), tree_cpu(kids)) for n, (p, kids) in boxes.items()}
        steps = side.steady_records("n1")[-1][1] - step0
        roles = {n: side.role(n) for n in boxes}
    finally:
        side.cluster.stop_all()
    shutil.rmtree(root, ignore_errors=True)
    return {n: {"daemon_ms_s": 1e3 * (after[n][0] - before[n][0]) / window,
                "worker_ms_s": 1e3 * (after[n][1] - before[n][1]) / window, "role": roles[n]}
            for n in boxes} | {"steps_per_s": steps / window}


def main() -> None:
    """Measure each checkpoint interval in turn and print a markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt-every", default="100,1000000", help="checkpoint intervals in steps, comma-separated")
    ap.add_argument("--window", type=float, default=20.0, help="seconds measured per interval")
    args = ap.parse_args()
    try:
        intervals = [int(x) for x in args.ckpt_every.split(",")]
    except ValueError:
        ap.error(f"--ckpt-every takes whole step counts separated by commas, not {args.ckpt_every!r}")
    if any(i <= 0 for i in intervals) or args.window <= 0:
        ap.error("--ckpt-every intervals and --window must be positive")
    print("| checkpoint every | box | role | daemon ms/s | worker ms/s | steps/s |")
    print("|---|---|---|---|---|---|")
    for every in intervals:
        res = measure(every, args.window)
        for n in ("n1", "n2"):
            r = res[n]
            print(f"| {every} | {n} | {r['role']} | {r['daemon_ms_s']:.1f} | {r['worker_ms_s']:.1f} | "
                  f"{res['steps_per_s']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
