"""Jobs that cannot train, for the tests of a job that halts with its reason (importable by the
workers as tests.operate.jobs:NAME when the daemons run from the repository root), among them
deterministic failures whose message differs on each try (as messages naming an address, a PID
or a free-memory figure do)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import torch

from dpeer.trainer.demo import build as demo_build
from dpeer.trainer.job_api import JobContext, TrainSpec

_TRIES = itertools.count()


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


def fails_every_step_with_a_changing_message(ctx: JobContext) -> TrainSpec:
    """The demo job whose loss raises at every training step, the same error with a figure that
    differs on each try, as an out-of-memory error's "MiB free" does. The build's probe of the loss
    (without gradients) passes, so the job fails in training, not at build."""
    spec = demo_build(ctx)
    loss_fn = spec.loss_fn

    def failing_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return loss_fn(out, target)
        raise MemoryError(f"tried to allocate 2.00 GiB; {512 - next(_TRIES) % 97} MiB free")

    spec.loss_fn = failing_loss
    return spec


def fails_to_build_with_a_changing_message(ctx: JobContext) -> TrainSpec:
    """A build that always raises, naming the process it ran in (a fresh one on each worker start)."""
    raise RuntimeError(f"cannot open the dataset: lock held (pid {os.getpid()})")


def pid_file_job(ctx: JobContext) -> TrainSpec:
    """The demo job, writing its worker's pid where the `pid_file` option says (for hygiene tests)."""
    Path(ctx.options["pid_file"]).write_text(str(os.getpid()))
    return demo_build(ctx)


def prints_and_fails_at_step(ctx: JobContext) -> TrainSpec:
    """fails_at_step, printing to stdout as a user's script does: a line at build and one each time
    the loss is taken (and a blank line, which only the job log keeps)."""
    print(f"building the printing job on {ctx.node_id}")
    print()
    spec = fails_at_step(ctx)
    loss_fn, schedule = spec.loss_fn, spec.scheduler
    assert schedule is not None

    def printing_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        print(f"taking the loss of step {schedule.last_epoch}")
        return loss_fn(out, target)

    spec.loss_fn = printing_loss
    return spec
