"""What a job gives the runtime and what the runtime tells it: ``job(ctx: JobContext) -> TrainSpec``.

The user's side of the API (docs/jobs.md); dpeer.trainer.loop re-exports it, where jobs written
against earlier versions import it from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch

from dpeer.trainer.jobspec import RUN_DEFAULTS, LossReduction, T, option


class Dataset(Protocol):
    """Anything indexable with a length; items are ``(input, target)`` tensors."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@dataclass
class JobContext:
    """What the runtime tells a job when building it: this box's name and device (``cuda:0`` when
    there is a GPU: one worker per box), the config's run shape typed (``steps`` .. ``lr``) and the
    job's options, which arrive as strings (``option`` types them)."""

    node_id: str
    device: torch.device
    options: dict[str, Any] = field(default_factory=dict)

    def option(self, key: str, default: T) -> T:
        """The option ``key`` as the type of ``default`` (bool, int, float, str), or ``default``."""
        return option(self.options, key, default)

    @property
    def steps(self) -> int:
        """training.steps: how many steps to train."""
        return self.option("steps", int(RUN_DEFAULTS["steps"]))

    @property
    def global_batch(self) -> int:
        """training.global_batch: samples per step, whatever the world size."""
        return self.option("global_batch", int(RUN_DEFAULTS["global_batch"]))

    @property
    def micro_batch(self) -> int:
        """training.micro_batch: the largest forward pass."""
        return self.option("micro_batch", int(RUN_DEFAULTS["micro_batch"]))

    @property
    def seed(self) -> int:
        """training.seed: seeds the sample order (and, by convention, the model and data)."""
        return self.option("seed", int(RUN_DEFAULTS["seed"]))

    @property
    def lr(self) -> float:
        """training.lr: the learning rate the job's optimizer should use."""
        return self.option("lr", float(RUN_DEFAULTS["lr"]))


@dataclass
class TrainSpec:
    """Everything a job provides. ``loss_fn(output, target)`` returns the SUM over the batch (the
    runtime divides by the global batch), or the mean with ``loss_reduction='mean'`` (the runtime
    multiplies it by the micro-batch's size); the build measures which and refuses a mismatch
    (jobspec.prepare). ``steps``, ``global_batch``, ``micro_batch`` and ``seed`` must be the
    config's (``ctx.steps`` ...). With a ``scaler`` (torch.amp.GradScaler) the loss
    is scaled before backward and ``scaler.step``/``update`` replace ``optimizer.step``; autocast,
    if wanted, belongs in the model's forward."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    dataset: Dataset
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    global_batch: int
    micro_batch: int
    steps: int
    seed: int
    scheduler: Any = None
    scaler: Any = None
    collate: Callable[[Sequence[Any]], tuple[torch.Tensor, torch.Tensor]] | None = None
    loss_reduction: LossReduction | str = LossReduction.SUM


def default_collate(items: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``(input, target)`` pairs into two batch tensors."""
    xs, ys = zip(*items)
    return torch.stack(list(xs)), torch.stack(list(ys))
