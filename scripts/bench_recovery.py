"""Recovery benchmark (issue 5): dpeer vs a torchrun-elastic baseline on the same job and machine.

Both sides train the demo MLP (``dpeer.trainer.demo``: same seed, data, global batch 64, micro
batch 16, SGD lr 0.05, same per-step sample indices, same manual flat gloo allreduce) on three
"boxes" on loopback, one rank per box, with a full-state checkpoint every ``--ckpt-every`` steps.

- torchrun: three ``torchrun --nnodes=2:3 --nproc-per-node=1 --rdzv-backend=c10d`` agents (one per
  box, same rdzv id and endpoint) each running ``scripts/torchrun_demo.py``. The c10d rendezvous
  store is served by a separate process of this script (the "rendezvous box", never killed), so
  any box can be killed; with torchrun's default the first agent hosts it and killing that box
  ends the job. Agents run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: in torch 2.13 the shared
  agent store is reused across rounds without a per-attempt prefix, so restarted workers read
  the dead round's gloo addresses ("Gloo connectFullMesh failed ... Connection refused") and
  churn through restarts; with it each round's rank 0 worker hosts a fresh store.
- dpeer: ``LocalCluster`` of three ``dpeer start --job demo`` daemons.

A trial: wait until the three boxes train together, measure the step time over a window, SIGKILL
one box (its whole process tree: daemon or agent, and its worker), measure the survivors'
recovery, restart the box on its old data dir, measure when it takes part again. Victims rotate
n2, n3, n1, ... Figures: (1) SIGKILL -> survivors' next committed step (in a group without the
victim); (2) committed steps redone (torchrun: steps since the checkpoint it resumed from; dpeer:
steps that appear twice in a survivor's ledger); (3) restart of the box -> its first committed
step in a group with it, with the restarted worker's own CPU seconds; (4) steady-state step time:
torchrun, dpeer and dpeer with a digest every step (``training.digest_every=1``) each on three
boxes, trained in turn in short windows while the other jobs' training processes are SIGSTOPped
(see ``recovery_steady.run_alternating``), reported as the median over rounds of dpeer/torchrun ratios.

``--pinned`` measures only the steady state, fairly for one core per box: torchrun and dpeer with
world size 2, each box (its agent or daemon and its worker, every thread) pinned with
``sched_setaffinity`` to its own core (n1 on core 0, n2 on core 1, for both jobs; checked before
measuring), trained in turn in 0.5 s windows as above (120 rounds, 40 with ``--quick``,
``--rounds N``). The paused job's agents or daemons keep running on the same cores (stopping
dpeer's would outlast its 0.3-0.6 s election timeout), so their CPU is measured too. Reported:
per-round dpeer/torchrun ratios of median step times (median [quartiles] and a bootstrap 95 %
interval of the median), the same with the paused job's CPU taken out, worker CPU per step, and
the agents' and daemons' CPU per second (/proc/PID/stat) while their job trains and while it is
paused (see ``recovery_steady.run_pinned``).

Usage: ``python scripts/bench_recovery.py [--quick] [--trials N] [--json FILE] [--keep] [--pinned] [--rounds N]``.
Everything started here runs in its own process group and is SIGKILLed on exit, error or Ctrl-C.
Both sides get OMP_NUM_THREADS=1 (three boxes share this machine's cores).
The pieces: recovery_common (settings, process trees, /proc), recovery_torchrun, recovery_dpeer,
recovery_steady (alternating windows, pinned or not) and recovery_report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recovery_common import loadavg
from recovery_dpeer import DpeerSide, run_dpeer
from recovery_report import details, pinned_summary, summary
from recovery_steady import (
    PIN_CORES,
    PIN_NODES,
    pinned_cores_available,
    run_alternating,
    run_pinned,
)
from recovery_torchrun import RDZV_CONF, TorchrunSide, run_torchrun

from dpeer.launch.cluster import free_port_block


def main() -> int:
    """Run the benchmark the flags ask for and print its report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="1 torchrun and 2 dpeer kills, 2 s trial windows, 10 alternating rounds (about 3 min)")
    ap.add_argument("--trials", type=int, default=None,
                    help="kills per side (default 4 torchrun, 5 dpeer; quick 1 and 2)")
    ap.add_argument("--window", type=float, default=None, help="steady window per trial, s (default 5, quick 2)")
    ap.add_argument("--ckpt-every", type=int, default=100, help="checkpoint interval, steps (both sides)")
    ap.add_argument("--only", choices=["torchrun", "dpeer"], default=None)
    ap.add_argument("--json", default=None, help="write every raw figure here")
    ap.add_argument("--keep", action="store_true", help="keep the run directory (logs, ledgers)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pinned", action="store_true",
                    help="only the steady state, world size 2, each box pinned to its own core (cores 0 and 1)")
    ap.add_argument("--reduction", choices=["exact", "fast"], default="exact",
                    help="dpeer's gradient sums: exact (the daemon's default, fixed point) or fast (float sums, "
                         "as torchrun's job does)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="alternating rounds (default 30, quick 10; pinned 120, quick 40)")
    args = ap.parse_args()
    if args.pinned and args.only:
        ap.error("--pinned runs both jobs' steady state only; it takes no --only")
    if args.pinned and not pinned_cores_available():
        ap.error(f"--pinned needs cores {sorted(PIN_CORES.values())} in this process's CPU mask")
    trials_tr = args.trials or (1 if args.quick else 4)
    trials_dp = args.trials or (2 if args.quick else 5)
    rounds = args.rounds or ((40 if args.quick else 120) if args.pinned else (10 if args.quick else 30))
    window = args.window or (2.0 if args.quick else 5.0)
    random.seed(args.seed)
    root = Path(tempfile.mkdtemp(prefix="bench_recovery_"))
    began = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - began:6.1f}s load {loadavg():.1f}] {msg}", flush=True)

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    import torch

    what = (f"pinned steady state, {rounds} rounds" if args.pinned else
            f"{trials_tr} torchrun / {trials_dp} dpeer kills, window {window:.0f}s")
    log(f"{platform.node()} {os.cpu_count()} cpus, Python {platform.python_version()}, torch {torch.__version__}; "
        f"{what}, checkpoint every {args.ckpt_every} steps, dpeer reduction {args.reduction}; dir {root}")
    results: dict[str, Any] = {"trials": [trials_tr, trials_dp], "window": window, "ckpt_every": args.ckpt_every,
                               "reduction": args.reduction,
                               "rdzv_conf": RDZV_CONF, "date": time.strftime("%Y-%m-%d %H:%M")}
    tr_side = dp_side = None
    try:
        if args.pinned:
            tr_side = TorchrunSide(root, args.ckpt_every, PIN_NODES, PIN_CORES)
            dp_side = DpeerSide(root, args.ckpt_every, "dpeer-pinned", nodes=PIN_NODES, cores=PIN_CORES,
                                reduction=args.reduction)
            results["pinned"] = {"reduction": args.reduction}
            run_pinned(tr_side, dp_side, rounds, log, results["pinned"])
        else:
            if args.only is None:
                tr_side = TorchrunSide(root, args.ckpt_every)
                dp_side = DpeerSide(root, args.ckpt_every, "dpeer-steady", reduction=args.reduction)
                d1_side = DpeerSide(root, args.ckpt_every, "dpeer-digest1", digest_every=1,
                                    base_port=free_port_block(3, start=dp_side.node("n3").port + 2),
                                    reduction=args.reduction)
                results["alternating"] = {}
                try:
                    run_alternating({"torchrun": tr_side, "dpeer": dp_side, "dpeer digest_every=1": d1_side}, rounds,
                                    log, results["alternating"])
                finally:
                    d1_side.cluster.stop_all()
                dp_side.cluster.stop_all()
            if args.only in (None, "torchrun"):
                tr_side = tr_side or TorchrunSide(root, args.ckpt_every)
                results["torchrun"] = {}
                run_torchrun(tr_side, trials_tr, window, log, results["torchrun"])
                tr_side.stop_all()
            if args.only in (None, "dpeer"):
                dp_side = DpeerSide(root, args.ckpt_every, reduction=args.reduction)
                results["dpeer"] = {}
                run_dpeer(dp_side, trials_dp, window, log, results["dpeer"])
                dp_side.cluster.stop_all()
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        return 130
    finally:
        if tr_side is not None:
            tr_side.stop_all()
        if dp_side is not None:
            dp_side.cluster.stop_all()
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.pinned:
        print()
        print(pinned_summary(results["pinned"]))
        log("done")
        return 0
    empty = {"recover": [], "redone": [], "rejoin": [], "redone_rejoin": [], "steady": []}
    tr, dp = results.get("torchrun", empty), results.get("dpeer", empty)
    print()
    print(summary(tr, dp, results.get("alternating", {})))
    for line in details(tr, dp):
        print(line)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
