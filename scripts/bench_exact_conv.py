"""The exact reduction's own cost per step against the fast one's, in one process (issue 37).

A 1-rank gloo group, the stepper driven micro-batch by micro-batch as step.py drives it, on the demo
MLP at dim 256, hidden 2048 (4.74M parameters), global batch 32 * ``--micro``, micro batch 32 (``--micro``
micro-batches a step, all on this rank), one thread. Two workloads:
- ``cheap``: the loss is sum(p * c) over the parameters for fixed random c, so backward writes each
  gradient at the cost of one multiply an element: the step is almost all the reduction's own work
  (fixed-point passes, copies, the 1-rank allreduce);
- ``model``: the demo's forward and backward on its data.
Arms fast and exact alternate for ``--rounds`` rounds; each prints the median step time over
``--steps`` steps after ``--warm``, and exact's extra milliseconds over fast. Peak RSS is not
measured here (one process runs both arms).

Usage: ``python scripts/bench_exact_conv.py [--steps 60] [--warm 10] [--rounds 3] [--work cheap,model]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from dpeer.trainer.demo import build
from dpeer.trainer.exact import ExactStep, configure_process
from dpeer.trainer.job_api import JobContext, TrainSpec
from dpeer.trainer.sampler import GlobalBatchSampler
from dpeer.trainer.stepping import FastStep


MICRO = 2  # micro-batches a step (--micro)


def spec() -> TrainSpec:
    options = {"dim": "256", "hidden": "2048", "global_batch": str(32 * MICRO), "micro_batch": "32",
               "dataset_len": "8192"}
    return build(JobContext("a", torch.device("cpu"), options))


def step_times(mode: str, work: str, steps: int) -> list[float]:
    s = spec()
    params = [p for p in s.model.parameters()]
    sampler = GlobalBatchSampler(len(s.dataset), s.global_batch, s.seed)
    cls = ExactStep if mode == "exact" else FastStep
    stepper = cls(s, params, sampler, torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    coeffs = [torch.randn(p.shape, generator=gen) * 1e-3 for p in params]
    out = []
    for n in range(steps):
        t0 = time.perf_counter()
        stepper.plan(n, 0, 1)
        stepper.begin()
        while True:
            for k, (_j, indices) in enumerate(stepper.planned()):
                stepper.enter(k)
                if work == "cheap":
                    loss = sum((p * c).sum() for p, c in zip(params, coeffs)) * (1.0 + k)
                else:
                    x, y = s.collate([s.dataset[i] for i in indices])
                    loss = s.loss_fn(s.model(x), y)
                stepper.backward(loss)
                stepper.leave(k)
            stepper.end_pass()
            if stepper.reduce(0, 1) is not None:
                break
        out.append(time.perf_counter() - t0)
    stepper.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warm", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", default="cheap,model")
    p.add_argument("--micro", type=int, default=2, help="micro-batches a step, all on this rank (1: the path of "
                   "a rank with one micro-batch, as in the 2-rank benchmark)")
    args = p.parse_args()
    global MICRO
    MICRO = args.micro
    configure_process(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    for work in args.work.split(","):
        figures: dict[str, list[float]] = {"fast": [], "exact": []}
        for r in range(args.rounds):
            for mode in (("fast", "exact") if r % 2 == 0 else ("exact", "fast")):
                t = statistics.median(step_times(mode, work, args.steps)[args.warm:])
                figures[mode].append(t)
            fast, exact = figures["fast"][-1], figures["exact"][-1]
            print(f"{work} round {r + 1}: fast {fast * 1e3:.2f} ms, exact {exact * 1e3:.2f} ms", flush=True)
        f, e = statistics.median(figures["fast"]), statistics.median(figures["exact"])
        print(f"{work}: median fast {f * 1e3:.2f} ms, exact {e * 1e3:.2f} ms, exact extra {(e - f) * 1e3:.2f} ms "
              f"({e / f:.2f}x)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
