"""Baseline for scripts/bench_steady.py: the dpeer demo job as a torchrun user writes it, with
DistributedDataParallel (bucketed allreduce overlapped with backward).

Run under ``torchrun --standalone --nproc-per-node N scripts/ddp_demo.py --out DIR [options]``, or
alone with ``--floor`` for the compute floor (one process, no communication, one rank's share of
each step). Model, data and per-step sample indices are dpeer's demo job (``dpeer.trainer.demo``,
``dpeer.trainer.sampler``); each rank takes its contiguous share of the step's global batch, in
micro-batches of ``--micro-batch``, accumulating under ``no_sync`` as DDP users do. Each committed
step appends ``{"t": wall time, "step": steps done}`` to ``DIR/rank<R>.jsonl``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dpeer.trainer.demo import build
from dpeer.trainer.loop import JobContext
from dpeer.trainer.sampler import GlobalBatchSampler, micro_batches, shard


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--floor", action="store_true", help="one process, no communication: the compute floor")
    p.add_argument("--world", type=int, default=2, help="with --floor: the world size whose one share to train")
    args = p.parse_args()
    torch.set_num_threads(1)
    rank, world = (0, args.world) if args.floor else (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    options = {"dim": str(args.dim), "hidden": str(args.hidden), "global_batch": str(args.global_batch),
               "micro_batch": str(args.micro_batch), "steps": str(args.steps)}
    spec = build(JobContext(f"r{rank}", torch.device("cpu"), options))
    model: torch.nn.Module = spec.model
    if not args.floor:
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    sampler = GlobalBatchSampler(len(spec.dataset), spec.global_batch, spec.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"rank{rank}.jsonl", "a", buffering=1) as log:
        for step in range(args.steps):
            batches = micro_batches(shard(sampler.indices_for_step(step), rank, world), spec.micro_batch)
            for i, mb in enumerate(batches):
                x, y = spec.collate([spec.dataset[j] for j in mb])  # type: ignore[misc]
                quiet = model.no_sync() if i < len(batches) - 1 and not args.floor else contextlib.nullcontext()
                with quiet:
                    spec.loss_fn(model(x), y).div(spec.global_batch / world).backward()
            spec.optimizer.step()
            spec.optimizer.zero_grad()
            log.write(json.dumps({"t": time.time(), "step": step + 1}) + "\n")
    if not args.floor:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
