"""One step of the training loop, as the job's own code runs it.

The loop over ``Trainer.steps()`` yields a ``Step``; the job runs its body inside ``with step:``:

    for step in trainer.steps():
        with step:
            for batch in step.micro_batches():   # this rank's share of the step's exact global batch
                step.backward(loss_of(batch))     # its loss, once per micro-batch
            optimizer.step()                      # the gradients are now the group's mean

When the micro-batch loop ends the step's sums have completed: the step is committed and every
``.grad`` holds the mean over the global batch, the same on every rank. A failure before that (a
dead or hung peer, the job's own exception) does not reach the job: ``with step:`` keeps it,
the loop reports it, re-forms the group, heals, and yields the same step again, with the state
as it was before it. The job's exception after the reduction (in its optimizer's step, say) is
reported too, but the state may already have changed: the worker restarts from the committed
state (loop.StateTorn) instead of redoing the step on it. In exact mode the micro-batch loop may run twice in one step (the first
step, or when a gradient outgrew its agreed range: a deterministic replay), so its body should
be the forward and the backward only.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, Iterator

import torch

from dpeer.trainer.allreduce import StepReduction
from dpeer.trainer.group import GroupSeat

if TYPE_CHECKING:
    from dpeer.trainer.loop import Trainer


class StepUsageError(RuntimeError):
    """The job's loop used a step wrongly; the text says what to change."""


class Step:
    """Step ``number`` of the run in the group seat ``seat`` (rank, world, generation)."""

    def __init__(self, trainer: Trainer, seat: GroupSeat, number: int, mean_loss: bool) -> None:
        self._trainer, self.seat, self.number, self._mean_loss = trainer, seat, number, mean_loss
        self._entered = False
        self._batches: Iterator[Any] | None = None
        self._current: tuple[int, int] | None = None  # the micro-batch awaiting backward: (n, samples)
        self.reduction: StepReduction | None = None
        self.error: BaseException | None = None

    @property
    def rank(self) -> int:
        """This rank in the current group (it may change when the group re-forms)."""
        return self.seat.rank

    @property
    def world(self) -> int:
        """The current group's size."""
        return self.seat.world

    @property
    def reduced(self) -> bool:
        """Whether the step's gradients are summed (the step is committed by the group)."""
        return self.reduction is not None

    def __enter__(self) -> Step:
        if self._entered:
            raise StepUsageError(f"step {self.number} was entered twice: use one `with step:` per step")
        self._entered = True
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        """Keep the step's failure for the loop, which reports it and redoes the step; a KeyboardInterrupt
        or a SystemExit goes on."""
        self._trainer.stepper.abort()
        if exc is None and not self.reduced:
            body = sys._getframe(1)  # the job's `with step:`: its traceback names the job's file and line
            exc = StepUsageError(
                f"step {self.number} ended before its gradients were reduced: run the loop over "
                f"step.micro_batches() to its end, with one step.backward(loss) per micro-batch "
                f"({body.f_code.co_filename}, line {body.f_lineno})")
            exc.__traceback__ = TracebackType(None, body, body.f_lasti, body.f_lineno)
        if self._batches is not None:
            self._batches.close()
        if exc is None or not isinstance(exc, Exception):
            return False
        self.error = exc
        return True

    def micro_batches(self) -> Iterator[Any]:
        """This rank's micro-batches of the step, as the job's data pipeline makes them; the gradients
        are reduced when the loop over them ends (the micro-batches may come again: see the module)."""
        if not self._entered:
            raise StepUsageError(f"step {self.number}: run the step's body inside `with step:`, so that a "
                                 f"failure is redone instead of ending the job")
        if self._batches is not None:
            raise StepUsageError(f"step {self.number}: step.micro_batches() was called twice")
        self._batches = self._run()
        return self._batches

    def _run(self) -> Iterator[Any]:
        t, planned = self._trainer, self._trainer.stepper.planned()
        t.stepper.begin(t.peek_newest())
        while True:
            for n, (j, indices) in enumerate(planned):
                t.stepper.enter(n)
                batch = t.feed.get(self.number, j, indices)
                self._current = (n, len(indices))
                yield batch
                if self._current is not None:
                    raise StepUsageError(f"step {self.number}: micro-batch {j} got no step.backward(loss)")
                t.stepper.leave(n)
            t.stepper.end_pass()
            reduction = t.reduce(self.seat)
            if reduction is not None:
                self.reduction = reduction
                return

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate the current micro-batch's loss: a mean over its samples when the run says
        so (torch's default; it is scaled to their sum), else their sum. One call a micro-batch:
        add several losses up first."""
        if self._current is None:
            raise StepUsageError(f"step {self.number}: step.backward(loss) is called once per micro-batch, "
                                 f"inside the loop over step.micro_batches(): add several losses up first")
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise StepUsageError(f"step {self.number}: the loss must be one number (a 0-dim tensor), got {shape}")
        _n, samples = self._current
        self._current = None
        self._trainer.stepper.backward(loss * samples if self._mean_loss else loss)
