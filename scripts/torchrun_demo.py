"""Baseline for scripts/bench_recovery.py: the dpeer demo job trained the plain torchrun-elastic way.

Run one per "box" under ``torchrun --nnodes=MIN:MAX --nproc-per-node=1 --rdzv-backend=c10d ...``.
Model, optimizer, data and per-step sample indices are exactly dpeer's demo job (it imports
``dpeer.trainer.demo.build`` and ``dpeer.trainer.sampler``) and the gradient is the same manual
flat allreduce over gloo (sum of per-sample losses, divided by the fixed global batch), so the
only differences from dpeer are how failures are handled: a dead peer makes the allreduce raise,
the worker exits non-zero, torchrun re-rendezvouses the surviving agents and restarts every
worker, which resumes from the newest checkpoint (rank 0 writes one atomically every
``--ckpt-every`` steps: temp file, fsync, rename, fsync dir).

Every event goes to ``<out>/logs/<node>.jsonl`` as one JSON line with wall time ``t``:
``start`` (process start, before ``import torch``), ``imported``, ``init`` (group formed),
``resumed`` (checkpoint step loaded), ``step`` (one per committed step: ``step`` = steps done,
``world``, ``rank``, ``restart``), ``ckpt``.
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse
import gc
import json
import os
import sys

NODE = "?"
LOG = None


def log(kind: str, **fields: object) -> None:
    fields.update(kind=kind, t=fields.get("t", time.time()), node=NODE, pid=os.getpid(),
                  restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    LOG.write(json.dumps(fields) + "\n")
    LOG.flush()


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="shared dir: checkpoints and logs")
    p.add_argument("--name", required=True, help="this box's name (log file)")
    p.add_argument("--steps", type=int, default=10**7)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--timeout", type=float, default=30.0, help="collective timeout, s")
    return p.parse_args()


def atomic_save(obj: object, path: str) -> None:
    import torch

    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> int:
    global NODE, LOG
    args = parse()
    NODE = args.name
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    ckpt_dir = os.path.join(args.out, "ckpt")
    os.makedirs(ckpt_dir, exist_ok=True)
    LOG = open(os.path.join(args.out, "logs", f"{NODE}.jsonl"), "a")  # noqa: SIM115 (lives as long as the process)
    log("start", t=T_START)

    import datetime as dt

    import torch
    import torch.distributed as dist

    from dpeer.trainer.allreduce import allreduce_step
    from dpeer.trainer.demo import build
    from dpeer.trainer.loop import JobContext
    from dpeer.trainer.sampler import GlobalBatchSampler, micro_batches, shard

    log("imported")
    opts = {"steps": args.steps, "global_batch": args.global_batch, "micro_batch": args.micro_batch,
            "seed": args.seed, "lr": args.lr}
    spec = build(JobContext(NODE, torch.device("cpu"), opts))
    sampler = GlobalBatchSampler(len(spec.dataset), spec.global_batch, spec.seed)
    params = [p for p in spec.model.parameters() if p.requires_grad]
    log("built")

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    log("init", rank=rank, world=world)

    step = 0
    path = os.path.join(ckpt_dir, "latest.pt")
    if os.path.exists(path):
        ck = torch.load(path, weights_only=False)
        spec.model.load_state_dict(ck["model"])
        spec.optimizer.load_state_dict(ck["optimizer"])
        step = int(ck["step"])
    log("resumed", step=step, rank=rank, world=world)
    # like dpeer's loop: move what exists now out of the collector's way, so the comparison
    # measures the runtimes' per-step work, not Python's generational GC over torch's import heap
    gc.collect(1)
    gc.freeze()

    while step < spec.steps:
        indices = sampler.indices_for_step(step)
        for p in params:
            p.grad = None
        loss_sum = 0.0
        for mb in micro_batches(shard(indices, rank, world), spec.micro_batch):
            x, y = spec.collate([spec.dataset[i] for i in mb])
            loss = spec.loss_fn(spec.model(x), y)
            loss.backward()
            loss_sum += float(loss.detach())
        red = allreduce_step(params, loss_sum, 0, rank, world, spec.global_batch, torch.device("cpu"))
        spec.optimizer.step()
        step += 1
        log("step", step=step, world=world, rank=rank, loss=red.loss_mean)
        if args.ckpt_every and step % args.ckpt_every == 0 and rank == 0:
            atomic_save({"model": spec.model.state_dict(), "optimizer": spec.optimizer.state_dict(),
                         "step": step}, path)
            log("ckpt", step=step)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
