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
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from dpeer.trainer.allreduce import StepReduction
from dpeer.trainer.group import GroupSeat
from dpeer.trainer.sampler import shard_bounds

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

    def evaluate(self, count: int, values: Callable[[range], torch.Tensor], batch: int = 1) -> torch.Tensor:
        """Evaluate sharded over the group: items ``range(count)`` in batches of ``batch``, whole
        batches per rank; ``values(items)`` returns one value per item of one batch (a 1-d tensor), and
        every rank gets all ``count`` of them in item order, the same bits whatever the world size
        (a batch is computed alike on any rank, and each element is summed with zeros only). Reduce
        them in order (``.mean()``) for a metric every box agrees on. Call it after the step's
        micro-batches: a failure here restarts the worker from the committed state, as any failure
        after the reduction does."""
        if not self.reduced:
            raise StepUsageError(f"step {self.number}: step.evaluate() runs after the loop over step.micro_batches()")
        if count < 1 or batch < 1:
            raise StepUsageError(f"step {self.number}: step.evaluate() needs count and batch of at least 1")
        first, end = shard_bounds(-(-count // batch), self.rank, self.world)
        full = torch.zeros(count, dtype=torch.float64, device=self._trainer.group.device)
        if end > first:
            parts = [self._values(values, range(b * batch, min((b + 1) * batch, count))) for b in range(first, end)]
            full[first * batch : min(end * batch, count)] = torch.cat(parts).to(full.device, torch.float64)
        self._trainer.all_sum(self.seat, full)
        return full.add_(0.0)  # -0.0 as +0.0 on every rank, as a sum with another rank's zero makes it

    def _values(self, values: Callable[[range], torch.Tensor], items: range) -> torch.Tensor:
        out = values(items)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(items),):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise StepUsageError(f"step {self.number}: step.evaluate's function got {len(items)} items and must "
                                 f"return a 1-d tensor of one value per item, not {got}")
        return out.detach()

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
            computing = 0.0  # the pass's micro-batches alone: fetch, forward, backward (no per-pass cost)
            for n, (j, indices) in enumerate(planned):
                began = time.monotonic()
                t.stepper.enter(n)
                batch = t.feed.get(self.number, j, indices)
                self._current = (n, len(indices))
                yield batch
                if self._current is not None:
                    raise StepUsageError(f"step {self.number}: micro-batch {j} got no step.backward(loss)")
                t.stepper.leave(n)
                computing += time.monotonic() - began
            t.stepper.end_pass()
            t.pace.computed(computing, len(planned))
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
