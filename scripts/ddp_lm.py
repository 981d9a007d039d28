"""Baseline for scripts/bench_steady.py's ``lm`` size: examples/lm/train.py as a torchrun user
writes it, with DistributedDataParallel and a DistributedSampler.

Run under ``torchrun --standalone --nproc-per-node N scripts/ddp_lm.py --out DIR [options]``, or
alone with ``--floor`` (one process, no communication, one rank's share of each step). The model,
data, optimizer, schedule, clipping and DataLoader settings are the example's (imported from it);
each rank accumulates its micro-batches under ``no_sync``. Each step appends ``{"t", "step"}`` to
``DIR/rank<R>.jsonl``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "lm" / "train.py"


def example() -> object:
    """The example's module (its main() only runs as a dpeer job)."""
    spec = importlib.util.spec_from_file_location("lm_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--floor", action="store_true", help="one process, no communication: the compute floor")
    p.add_argument("--world", type=int, default=2, help="with --floor: the world size whose one share to train")
    args = p.parse_args()
    torch.set_num_threads(1)
    rank, world = (0, args.world) if args.floor else (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    lm = example()
    text = lm.CORPUS.read_text(encoding="utf-8")
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(ch) for ch in text], dtype=torch.long)
    block = 64
    train = lm.Windows(ids[: int(len(ids) * 0.9)], block)
    torch.manual_seed(1234)
    model: torch.nn.Module = lm.CharLM(len(vocab), block, 64, 2, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lm.warmup_cosine(20, args.steps))
    if not args.floor:
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    sampler = torch.utils.data.DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=1234)
    loader = torch.utils.data.DataLoader(train, batch_size=args.micro_batch, sampler=sampler, num_workers=2,
                                         persistent_workers=True, drop_last=True)
    per_rank = args.global_batch // world // args.micro_batch
    args.out.mkdir(parents=True, exist_ok=True)
    batches, epoch = iter(loader), 0
    with open(args.out / f"rank{rank}.jsonl", "a", buffering=1) as log:
        for step in range(args.steps):
            for i in range(per_rank):
                try:
                    x, y = next(batches)
                except StopIteration:
                    epoch += 1
                    sampler.set_epoch(epoch)
                    batches = iter(loader)
                    x, y = next(batches)
                quiet = model.no_sync() if i < per_rank - 1 and not args.floor else contextlib.nullcontext()
                with quiet:
                    lm.loss_of(model, x, y).div(per_rank).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            log.write(json.dumps({"t": time.time(), "step": step + 1}) + "\n")
    del batches, loader  # its worker processes stop before the group goes (else the exit can hang mid-epoch)
    if not args.floor:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
