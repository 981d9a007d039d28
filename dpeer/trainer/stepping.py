"""One step's local work and its reduction, in the mode ``training.reduction`` selects.

A stepper is driven micro-batch by micro-batch by the step handle (step.py), since the forward is
the job's code: ``plan`` says what this rank trains of a step (for the ledger), ``begin`` starts it,
``enter``/``backward``/``leave`` wrap each micro-batch, ``end_pass`` starts whatever sum the last
backward did not (overlap.py launches buckets as that backward fills them), and ``reduce`` waits
for the sums, which commits the step, and leaves the mean gradient in every ``.grad``; or returns
None when the micro-batches must run again (exact mode's redo) before a second ``end_pass`` and
``reduce``. ``FastStep`` sums float32 in the
collective's order; ``exact.ExactStep`` is the bitwise-exact one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.distributed as dist

from dpeer.trainer.allreduce import StepReduction
from dpeer.trainer.overlap import Bucket, GradViews, Overlap, plan_buckets, wait_all
from dpeer.trainer.sampler import GlobalBatchSampler, micro_batches, shard

if TYPE_CHECKING:
    from dpeer.trainer.job_api import TrainSpec


FAST_BUCKET_BYTES = 25 << 20  # DDP's bucket_cap_mb: at 25.3M parameters a step 7 % shorter than in 4 MiB buckets


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
                 device: torch.device) -> None:
        self.spec, self.params, self.sampler, self.device = spec, params, sampler, device
        self.numel = sum(p.numel() for p in params)
        self.dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
        self._world = 0
        self._buf = torch.zeros(0, dtype=self.dtype, device=device)
        self._grads: GradViews | None = None
        self._overlap: Overlap | None = None
        self._works: list[Any] = []
        self._planned: tuple[int, int, int, list[tuple[int, list[int]]]] = (0, 0, 1, [])
        self._loss_sum, self._n = 0.0, 0

    def _buffer(self, world: int) -> torch.Tensor:
        """The step buffer of a group of ``world``, its views bound and its buckets planned."""
        if world != self._world:
            self.close()
            control = 1 + world
            self._buf = torch.zeros(control + self.numel, dtype=self.dtype, device=self.device)
            self._grads = GradViews(self.params, self._buf[control:])
            buckets = plan_buckets(self.numel, control, self._buf.element_size(), bucket_bytes=FAST_BUCKET_BYTES)
            if not self._grads.loose:  # a gradient of its own is copied in after backward, never overlapped
                self._overlap = Overlap(self.params, self._grads.offsets, buckets, control, self._launch)
            self._world = world
        return self._buf

    def _launch(self, _k: int, bucket: Bucket) -> None:
        self._works.append(dist.all_reduce(self._buf[bucket.lo:bucket.hi], async_op=True))

    def keys(self, step: int, rank: int, world: int, shares: Sequence[int] = ()) -> list[tuple[int, list[int]]]:
        """This rank's micro-batches of ``step`` in order, each ``(id, dataset indices)``: its contiguous
        share of the step's samples (weighted by ``shares``) cut into micro-batches of at most ``micro_batch``."""
        mine = shard(self.sampler.indices_for_step(step), rank, world, shares)
        return list(enumerate(micro_batches(mine, self.spec.micro_batch)))

    def plan(self, step: int, rank: int, world: int, shares: Sequence[int] = ()) -> Trained:
        """What this rank trains of ``step`` (recorded before any of its sums can leave)."""
        keys = self.keys(step, rank, world, shares)
        self._planned = (step, rank, world, keys)
        return Trained(step, None, [i for _, mb in keys for i in mb])

    def planned(self) -> list[tuple[int, list[int]]]:
        """The planned micro-batches, ``(id, dataset indices)``, in the order they run."""
        return self._planned[3]

    def begin(self, newest_seen: int = -1) -> None:
        """Start the planned step: the buffer zeroed, the gradients bound to it, nothing launched."""
        _step, rank, world, _keys = self._planned
        buf = self._buffer(world)
        assert self._grads is not None
        buf.zero_()
        self._grads.bind()
        self._works = []
        if self._overlap is not None:
            self._overlap.disarm()  # a step that failed half-way may have left it armed
        buf[1 + rank] = float(newest_seen)
        self._loss_sum, self._n = 0.0, 0

    def enter(self, n: int) -> None:
        """Micro-batch ``n`` of the plan starts (fast mode seeds nothing)."""
        self._n = n

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the current micro-batch's summed loss into the buffer; the last one's buckets
        start their sums as backward fills them (the control slots travel in the bucket launched last)."""
        self._loss_sum += float(loss.detach())
        if self._n == len(self._planned[3]) - 1:
            self._buf[0] = self._loss_sum
            if self._overlap is not None:
                self._overlap.arm()
        (self.spec.scaler.scale(loss) if self.spec.scaler is not None else loss).backward()

    def leave(self, n: int) -> None:
        """Micro-batch ``n`` is done (its gradient already accumulated in the buffer)."""

    def abort(self) -> None:
        """A micro-batch failed half-way: nothing to put back."""

    def end_pass(self) -> None:
        """Every micro-batch ran: start whatever sum has not started."""
        if self._overlap is None:
            assert self._grads is not None
            self._grads.gather_loose()
            self._works = [dist.all_reduce(self._buf, async_op=True)]
        else:
            if not self._planned[3]:
                self._buf[0] = self._loss_sum
                self._overlap.arm()
            self._overlap.finish()

    def reduce(self, rank: int, world: int) -> StepReduction | None:
        """Wait for the group's sums; ``.grad`` becomes the mean over the global batch (never a redo)."""
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
