"""Whether a script job's DataLoader hides a slow fetch behind the compute (issue 36).

One process, a 1-rank gloo group, exact reduction, the step path a script job runs (the stepper
driven micro-batch by micro-batch, its micro-batches from feed.LoaderFeed) on the demo MLP. Three
arms, each a median step time over ``--steps`` steps after ``--warm``:
- compute: the micro-batches come from memory (a dataset whose fetch costs nothing);
- slow, workers=0: every sample's fetch sleeps (``--fetch-ms`` a micro-batch in all, set to about
  the compute's step time: a fetch that waits on a disk or a network, not on this CPU), on the
  training thread;
- slow, workers=N: the same dataset with ``num_workers=N`` DataLoader worker processes.
The arms alternate for ``--rounds`` rounds; each round's ratios to its compute arm are printed, and
their medians are the figures (the issue's bar: workers=2 within 1.1x of compute only).

Usage: ``python scripts/bench_data.py [--steps 200] [--warm 20] [--workers 2] [--rounds 3]
[--fetch-ms 0 (auto: the compute's step over its micro-batches)]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from dpeer.trainer.demo import build
from dpeer.trainer.exact import ExactStep, configure_process
from dpeer.trainer.feed import LoaderFeed
from dpeer.trainer.job_api import JobContext, TrainSpec
from dpeer.trainer.sampler import GlobalBatchSampler


class Slow(torch.utils.data.Dataset):
    """The demo's dataset with a fetch that waits ``seconds`` a sample."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        if self.seconds:
            time.sleep(self.seconds)
        return self.inner[i]


def spec() -> TrainSpec:
    options = {"dim": "256", "hidden": "2048", "global_batch": "64", "micro_batch": "32", "dataset_len": "8192"}
    return build(JobContext("a", torch.device("cpu"), options))


def step_times(s: TrainSpec, dataset: Any, workers: int, steps: int) -> list[float]:
    """Train ``steps`` steps with a feed over ``dataset``; each step's seconds."""
    sampler = GlobalBatchSampler(len(dataset), s.global_batch, s.seed)
    stepper = ExactStep(s, [p for p in s.model.parameters()], sampler, torch.device("cpu"))
    loader = torch.utils.data.DataLoader(dataset, batch_size=s.micro_batch, num_workers=workers,
                                         persistent_workers=workers > 0)
    feed = LoaderFeed(loader, s.micro_batch, s.seed)
    feed.replan(lambda n: stepper.keys(n, 0, 1))
    out = []
    for n in range(steps):
        t0 = time.perf_counter()
        stepper.plan(n, 0, 1)
        stepper.begin()
        while True:
            for k, (j, indices) in enumerate(stepper.planned()):
                stepper.enter(k)
                x, y = feed.get(n, j, indices)
                stepper.backward(s.loss_fn(s.model(x), y))
                stepper.leave(k)
            stepper.end_pass()
            if stepper.reduce(0, 1) is not None:
                break
        s.optimizer.step()
        out.append(time.perf_counter() - t0)
    feed.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warm", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--fetch-ms", type=float, default=0.0, help="a micro-batch's fetch in ms (0: the compute's step)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    configure_process(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    micro = spec().global_batch // spec().micro_batch
    ratios: dict[int, list[float]] = {0: [], args.workers: []}
    for r in range(args.rounds):
        base = spec()
        compute = statistics.median(step_times(base, base.dataset, 0, args.steps)[args.warm:])
        fetch_ms = args.fetch_ms or compute * 1000 / micro
        print(f"round {r + 1}: compute only {compute * 1000:.1f} ms a step; fetch {fetch_ms:.1f} ms a micro-batch",
              flush=True)
        for workers in ratios:
            s = spec()
            slow = Slow(s.dataset, fetch_ms / 1000 / s.micro_batch)
            t = statistics.median(step_times(s, slow, workers, args.steps)[args.warm:])
            ratios[workers].append(t / compute)
            print(f"round {r + 1}: slow fetch, num_workers={workers}: {t * 1000:.1f} ms a step, "
                  f"{t / compute:.2f}x compute only", flush=True)
    for workers, values in ratios.items():
        print(f"median over {args.rounds} rounds: num_workers={workers} {statistics.median(values):.2f}x compute only")
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
