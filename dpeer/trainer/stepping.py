"""One step's local work and its reduction, in the mode ``training.reduction`` selects.

A stepper runs in two halves around the loop's bookkeeping: ``compute`` trains this rank's share of
the step (and says what it trained, for the ledger) and starts the step's allreduce bucket by
bucket as its last backward fills them (overlap.py); ``reduce`` waits for the sums, which commits
the step, and leaves the mean gradient in every ``.grad``. ``FastStep`` sums float32 in the
collective's order; ``exact.ExactStep`` is the bitwise-exact one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dpeer.trainer.allreduce import StepReduction
from dpeer.trainer.overlap import Bucket, GradViews, Overlap, plan_buckets, wait_all
from dpeer.trainer.sampler import GlobalBatchSampler, micro_batches, shard

if TYPE_CHECKING:
    from dpeer.trainer.job_api import TrainSpec


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
    micro-batches of at most ``micro_batch``) into gradients that are views of one flat buffer, and
    the group sums that buffer in buckets started during the last backward (overlap.py), in the
    collective's order, so the result agrees with another world size's only to rounding.

    The buffer is ``[loss sum | newest generation seen, per rank | gradients]``."""

    def __init__(self, spec: TrainSpec, params: list[torch.Tensor], sampler: GlobalBatchSampler,
                 device: torch.device, collate: Any) -> None:
        self.spec, self.params, self.sampler, self.device, self.collate = spec, params, sampler, device, collate
        self.numel = sum(p.numel() for p in params)
        self.dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
        self._world = 0
        self._buf = torch.zeros(0, dtype=self.dtype, device=device)
        self._grads: GradViews | None = None
        self._overlap: Overlap | None = None
        self._works: list[Any] = []
        self._planned: tuple[int, int, int, list[int]] = (0, 0, 1, [])

    def _buffer(self, world: int) -> torch.Tensor:
        """The step buffer of a group of ``world``, its views bound and its buckets planned."""
        if world != self._world:
            self.close()
            control = 1 + world
            self._buf = torch.zeros(control + self.numel, dtype=self.dtype, device=self.device)
            self._grads = GradViews(self.params, self._buf[control:])
            buckets = plan_buckets(self.numel, control, self._buf.element_size())
            if not self._grads.loose:  # a gradient of its own is copied in after backward, never overlapped
                self._overlap = Overlap(self.params, self._grads.offsets, buckets, control, self._launch)
            self._world = world
        return self._buf

    def _launch(self, _k: int, bucket: Bucket) -> None:
        self._works.append(dist.all_reduce(self._buf[bucket.lo:bucket.hi], async_op=True))

    def plan(self, step: int, rank: int, world: int) -> Trained:
        """What this rank trains of ``step`` (recorded before any of its sums can leave)."""
        self._planned = (step, rank, world, shard(self.sampler.indices_for_step(step), rank, world))
        return Trained(step, None, self._planned[3])

    def compute(self, newest_seen: int = -1) -> None:
        """Forward and backward over the planned share, gradients accumulated in the buffer; the
        buckets' sums start as the last backward fills them."""
        spec = self.spec
        _step, rank, world, mine = self._planned
        buf = self._buffer(world)
        grads = self._grads
        assert grads is not None
        buf.zero_()
        grads.bind()
        self._works = []
        if self._overlap is not None:
            self._overlap.disarm()  # a step that failed half-way may have left it armed
        batches = micro_batches(mine, spec.micro_batch)
        buf[1 + rank] = float(newest_seen)
        loss_sum = 0.0
        for n, mb in enumerate(batches, 1):
            x, y = self.collate([spec.dataset[i] for i in mb])
            loss = spec.loss_fn(spec.model(x.to(self.device)), y.to(self.device))
            loss_sum += float(loss.detach())
            if n == len(batches):  # the control slots travel in the bucket launched last
                buf[0] = loss_sum
                if self._overlap is not None:
                    self._overlap.arm()
            (spec.scaler.scale(loss) if spec.scaler is not None else loss).backward()
        if self._overlap is None:
            grads.gather_loose()
            self._works = [dist.all_reduce(buf, async_op=True)]
        else:
            if not batches:
                self._overlap.arm()
            self._overlap.finish()

    def reduce(self, rank: int, world: int) -> StepReduction:
        """Wait for the group's sums; ``.grad`` becomes the mean over the global batch."""
        works, self._works = self._works, []
        wait_all(works)
        buf, control = self._buf, 1 + world
        seen = buf[:control].to("cpu")
        buf[control:].mul_(1.0 / self.spec.global_batch)
        if self._grads is not None:
            self._grads.scatter_loose()
        return StepReduction(float(seen[0]) / self.spec.global_batch, [int(v) for v in seen[1:].tolist()])

    def close(self) -> None:
        """Remove the gradient hooks."""
        if self._overlap is not None:
            self._overlap.close()
            self._overlap = None
        self._world = 0

    def state(self) -> dict[str, Any]:
        """Nothing beyond the model and optimizer."""
        return {}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Nothing to restore."""
