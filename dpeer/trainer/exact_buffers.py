"""The model state one micro-batch of an exact step (exact.py) must not leak into the next: the
norm layers' running statistics (combined exactly over the step's micro-batches), any other buffer
(refused when forward changes it) and torch's generators (seeded per micro-batch, put back after)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from dpeer.trainer.exact_rules import ExactModeError
from dpeer.trainer.sampler import GlobalBatchSampler, micro_batch_slice
from dpeer.trainer.seeding import restore_rng, seed_rng, seeded

if TYPE_CHECKING:
    from dpeer.trainer.job_api import TrainSpec

_NORMS = torch.nn.modules.batchnorm._NormBase


class NormBuffers:
    """The running statistics of the model's norm layers, combined exactly over a step's micro-batches."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.buffers = [b for m in model.modules() if isinstance(m, _NORMS) and m.track_running_stats
                        for b in m.buffers(recurse=False)]
        self.numel = sum(b.numel() for b in self.buffers)
        self._start: list[torch.Tensor] = []

    def snapshot(self) -> None:
        """Remember the step's start values."""
        self._start = [b.detach().clone() for b in self.buffers]

    def restore(self) -> None:
        """Put the step's start values back (before each micro-batch)."""
        for b, s in zip(self.buffers, self._start):
            b.copy_(s)

    def write(self, slot: torch.Tensor) -> None:
        """Copy the values one micro-batch's forward left into its float64 slot (-0.0 made +0.0, as the
        collective's x + 0 would)."""
        off = 0
        for b in self.buffers:
            slot[off : off + b.numel()].copy_(b.reshape(-1))
            off += b.numel()
        slot.add_(0.0)

    def combine(self, slots: torch.Tensor) -> None:
        """Set every buffer to the mean of its M slots ([M, numel], summed in micro-batch order)."""
        if not self.buffers:
            return
        total = slots[0].clone()
        for j in range(1, slots.shape[0]):
            total += slots[j]
        mean = total / slots.shape[0]
        off = 0
        for b in self.buffers:
            seg = mean[off : off + b.numel()].view(b.shape)
            off += b.numel()
            if not b.is_floating_point():
                if not torch.equal(seg, seg.round()):
                    raise ExactModeError("an integer norm-layer buffer changed differently in different micro-batches")
                seg = seg.round()
            b.copy_(seg)


def refuse_changing_buffers(spec: TrainSpec, norms: NormBuffers, sampler: GlobalBatchSampler,
                            collate: Any, device: torch.device) -> None:
    """A probe forward of step 0's first micro-batch (no gradients, generators and norm statistics
    put back): any buffer other than norm statistics that it changes is refused with ExactModeError."""
    others = {name: b for name, b in spec.model.named_buffers() if not any(b is n for n in norms.buffers)}
    if not others:
        return
    before = {name: (id(b), b._version) for name, b in others.items()}
    x, _ = collate([spec.dataset[i] for i in micro_batch_slice(sampler.indices_for_step(0), spec.micro_batch, 0)])
    norms.snapshot()
    with torch.no_grad(), seeded(0, device):
        spec.model(x.to(device))
    norms.restore()
    after = dict(spec.model.named_buffers())
    changed = sorted(n for n in before if n not in after or (id(after[n]), after[n]._version) != before[n])
    if changed:
        raise ExactModeError(
            f"the model's forward changes buffer(s) {', '.join(changed)}, which exact reduction cannot combine "
            f"over micro-batches (it combines BatchNorm and InstanceNorm running statistics only): "
            f"use training.reduction: fast, or keep that state out of buffers")


class Isolation:
    """Each micro-batch of a step runs alone: norm statistics at the step's start values before it,
    torch's generators seeded for it until it ends; after the step's micro-batches, any other
    buffer their forwards changed is refused (a script job's forward is found out here, not at build)."""

    def __init__(self, spec: TrainSpec, norms: NormBuffers, device: torch.device) -> None:
        self.spec, self.norms, self.device = spec, norms, device
        self._others = [b for b in spec.model.buffers() if not any(b is n for n in norms.buffers)]
        self._versions: list[int] = []
        self._rng: tuple[torch.Tensor, torch.Tensor | None] | None = None  # generator states the seeding saved

    def begin(self) -> None:
        """The step starts: its norm statistics and the other buffers' versions remembered."""
        self.norms.snapshot()
        self._versions = [b._version for b in self._others]

    def enter(self, seed: int) -> None:
        """A micro-batch starts: norm statistics at the step's start values, generators seeded to ``seed``."""
        self.norms.restore()
        self._rng = seed_rng(seed, self.device)

    def abort(self) -> None:
        """Put torch's generators back if a micro-batch left them seeded (it ended, or failed), and the
        norm statistics at the step's start values."""
        if self._rng is not None:
            restore_rng(self._rng, self.device)
            self._rng = None
            self.norms.restore()

    def end(self) -> None:
        """Every micro-batch ran: norm statistics back at the step's start values (until combined),
        ExactModeError if a forward changed another buffer."""
        self.norms.restore()
        if [b._version for b in self._others] != self._versions:
            names = [n for n, b in self.spec.model.named_buffers() if any(b is x for x in self._others)]
            raise ExactModeError(
                f"the model's forward changed buffer(s) among {', '.join(names)}, which exact reduction cannot "
                f"combine over micro-batches (it combines BatchNorm and InstanceNorm running statistics only): "
                f"use training.reduction: fast, or keep that state out of buffers")
