"""ExactStep in one process: a 1-rank Gloo group (a fixture), the demo spec, a stepper and its gradients."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch
import torch.distributed as dist

from dpeer.trainer.demo import build
from dpeer.trainer.allreduce import StepReduction
from dpeer.trainer.exact import ExactStep
from dpeer.trainer.feed import InlineFeed
from dpeer.trainer.loop import JobContext, TrainSpec, default_collate
from dpeer.trainer.sampler import GlobalBatchSampler
from dpeer.trainer.stepping import FastStep
from tests.support.gloo import init_gloo

CPU = torch.device("cpu")


@pytest.fixture
def group() -> Iterator[None]:
    init_gloo(0, 1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def demo(**options: object) -> TrainSpec:
    return build(JobContext("a", CPU, {"dataset_len": 256, "global_batch": 16, "micro_batch": 4, **options}))


def stepper(spec: TrainSpec) -> ExactStep:
    sampler = GlobalBatchSampler(len(spec.dataset), spec.global_batch, spec.seed)
    return ExactStep(spec, [p for p in spec.model.parameters() if p.requires_grad], sampler, CPU,
                     spec.collate or default_collate)


def grads(spec: TrainSpec) -> list[torch.Tensor]:
    return [p.grad.clone() for p in spec.model.parameters()]


def run_step(step: ExactStep | FastStep, rank: int = 0, world: int = 1) -> StepReduction:
    """Run the planned step's micro-batches on the spec's data as the trainer does, redo included."""
    spec = step.spec
    feed = InlineFeed(spec.dataset, spec.collate or default_collate)
    step.begin()
    while True:
        for n, (j, indices) in enumerate(step.planned()):
            step.enter(n)
            x, y = feed.get(0, j, indices)
            step.backward(spec.loss_fn(spec.model(x), y))
            step.leave(n)
        step.end_pass()
        red = step.reduce(rank, world)
        if red is not None:
            return red
