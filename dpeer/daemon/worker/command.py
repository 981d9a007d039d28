"""The worker process's command line and environment: `python -m dpeer.trainer.worker` with the
job, its training options, the channel's folder, the checkpoints' folder and the store's bind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dpeer.address import Address
from dpeer.daemon.config import TrainingConfig


def worker_command(node_id: str, job: str, t: TrainingConfig, worker_dir: Path, ckpt_dir: Path,
                   store_bind: tuple[str, int]) -> list[str]:
    """The command line of a worker of `job` on box `node_id` (the daemon is its parent)."""
    opts = {**t.options, "steps": t.steps, "global_batch": t.global_batch, "micro_batch": t.micro_batch,
            "seed": t.seed, "lr": t.lr}
    host, port = store_bind
    cmd = [sys.executable, "-m", "dpeer.trainer.worker", "--node-id", node_id, "--job", job,
           "--views", f"dir:{worker_dir}", "--ledger", str(worker_dir / "ledger.jsonl"),
           "--final-out", str(worker_dir / "final.pt"),
           "--ckpt-dir", str(ckpt_dir), "--ckpt-every", str(t.checkpoint_every),
           "--digest-every", str(t.digest_every), "--reduction", t.reduction, "--threads", str(t.threads),
           "--store-bind", str(Address(host, port)), "--parent-pid", str(os.getpid())]
    if t.init_from:
        cmd += ["--init-from", t.init_from]
    for key, value in opts.items():
        cmd += ["--job-opt", f"{key}={value}"]
    return cmd


def worker_env() -> dict[str, str]:
    """A worker's environment: the daemon's, unbuffered."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}
