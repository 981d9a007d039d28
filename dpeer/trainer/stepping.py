"""One step's local work and its reduction, in the mode ``training.reduction`` selects.

A stepper runs in two halves around the loop's bookkeeping: ``compute`` trains this rank's share of
the step (and says what it trained, for the ledger), ``reduce`` sums the group's gradients in the
step's allreduce, which commits the step, and leaves the mean gradient in every ``.grad``.
``FastStep`` is the float32 path of old; ``exact.ExactStep`` is the bitwise-exact one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dpeer.trainer.allreduce import StepReduction, allreduce_step
from dpeer.trainer.sampler import GlobalBatchSampler, micro_batches, shard

if TYPE_CHECKING:
    from dpeer.trainer.loop import TrainSpec


class Reduction(enum.Enum):
    """How a step's gradients are summed (config key ``training.reduction``)."""

    EXACT = "exact"  # fixed-point sums: the same bits in any world size (dpeer/trainer/exact.py)
    FAST = "fast"  # float32 sums in the collective's order: equal across world sizes only to rounding


@dataclass(frozen=True)
class Trained:
    """What this rank trained in a step: the step's micro-batch indices it ran (exact mode; None in
    fast mode, where a rank's share is not made of whole micro-batches) and their dataset indices."""

    step: int
    micro_batches: list[int] | None
    indices: list[int]


class FastStep:
    """Fast reduction: each rank accumulates its contiguous share of the step's samples (in
    micro-batches of at most ``micro_batch``) and the group sums one float32 buffer in the
    collective's order, so the result agrees with another world size's only to rounding."""

    def __init__(self, spec: TrainSpec, params: list[torch.Tensor], sampler: GlobalBatchSampler,
                 device: torch.device, collate: Any) -> None:
        self.spec, self.params, self.sampler, self.device, self.collate = spec, params, sampler, device, collate
        self._loss_sum = 0.0

    def compute(self, step: int, rank: int, world: int) -> Trained:
        """Forward and backward over this rank's share, gradients accumulated in ``.grad``."""
        spec = self.spec
        mine = shard(self.sampler.indices_for_step(step), rank, world)
        for p in self.params:
            p.grad = None
        loss_sum = 0.0
        for mb in micro_batches(mine, spec.micro_batch):
            x, y = self.collate([spec.dataset[i] for i in mb])
            loss = spec.loss_fn(spec.model(x.to(self.device)), y.to(self.device))
            (spec.scaler.scale(loss) if spec.scaler is not None else loss).backward()
            loss_sum += float(loss.detach())
        self._loss_sum = loss_sum
        return Trained(step, None, mine)

    def reduce(self, newest_seen: int, rank: int, world: int) -> StepReduction:
        """Sum the group's gradients and loss; ``.grad`` becomes the mean over the global batch."""
        return allreduce_step(self.params, self._loss_sum, newest_seen, rank, world,
                              self.spec.global_batch, self.device)

    def state(self) -> dict[str, Any]:
        """Nothing beyond the model and optimizer."""
        return {}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Nothing to restore."""
