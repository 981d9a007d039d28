"""Jobs that cannot train, for the tests of a job that halts with its reason (importable by the
workers as tests.operate.jobs:NAME when the daemons run from the repository root)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dpeer.trainer.demo import build as demo_build
from dpeer.trainer.loop import JobContext, TrainSpec


def fails_to_build(ctx: JobContext) -> TrainSpec:
    """Raises at build while the file named by the `broken` option exists (delete it to fix the job)."""
    marker = Path(ctx.options["broken"])
    if marker.exists():
        raise ModuleNotFoundError(f"No module named 'missing_dependency' (marker {marker.name})")
    return demo_build(ctx)


def fails_at_step(ctx: JobContext) -> TrainSpec:
    """The demo job whose loss raises when step 3 is taken, on every box, every time (before any
    state changes, so every redo meets the same error). The step is read from an LR schedule,
    which the runtime keeps with the training state."""
    spec = demo_build(ctx)
    spec.scheduler = torch.optim.lr_scheduler.LambdaLR(spec.optimizer, lambda epoch: 1.0)
    loss_fn, schedule = spec.loss_fn, spec.scheduler

    def failing_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if schedule.last_epoch == 3:
            raise ValueError("boom: the loss has no value for step 3")
        return loss_fn(out, target)

    spec.loss_fn = failing_loss
    return spec


def pid_file_job(ctx: JobContext) -> TrainSpec:
    """The demo job, writing its worker's pid where the `pid_file` option says (for hygiene tests)."""
    Path(ctx.options["pid_file"]).write_text(str(os.getpid()))
    return demo_build(ctx)
