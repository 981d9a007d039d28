"""State carried from one step to the next, one row per stream (truncated BPTT's hidden state), for a
run that reads its data as parallel streams (``run.steps(loader, order="streams")``,
sampler.StreamsSampler: row ``b`` of every step's global batch is stream ``b``).

    hidden = Carried(torch.zeros(run.global_batch, H))
    run.register(model=model, optimizer=opt, hidden=hidden)
    for step in run.steps(loader, order="streams"):
        with step:
            for x, y in step.micro_batches():
                h = hidden.read()                # this micro-batch's streams' rows, as the step began
                out, h_new = model(x, h)
                hidden.write(h_new)              # their rows for the next step (detached)
                step.backward(loss_fn(out, y))
            opt.step()

What it guarantees. ``read`` returns the rows as they were when the step began (the initial value's
at the first step of each epoch), however often the micro-batch loop runs (a redo, exact mode's
replay). ``write`` keeps the new rows aside; they become the value only when the step commits. Each
rank computes only its micro-batches' rows, so the rows are shared in the step, before its
gradients' sum completes: every rank adds its written rows into a tensor of zeros and the group
sums it; each element has one nonzero term, and ``x + 0`` is ``x`` exactly in any order (a -0.0 is
made +0.0 on every world size alike), so every rank holds every row, bit for bit what one box
computes. The value is registered state: a heal or a checkpoint at step ``s`` holds the rows after
step ``s - 1``, so a re-formed group or a healed newcomer continues each stream where the group was.
A failed step leaves the value as it was. The cost: one allreduce a step of the carried tensor.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class CarryUsageError(RuntimeError):
    """A carried state was used wrongly; the text says what to change."""


class Carried:
    """A ``[global_batch, ...]`` tensor carried across steps, row ``b`` for stream ``b`` (see the
    module). ``reset_each_epoch``: every stream starts again from ``initial`` at an epoch's first step
    (its first window); False carries the last window's rows into the next epoch's first."""

    def __init__(self, initial: torch.Tensor, reset_each_epoch: bool = True) -> None:
        if not isinstance(initial, torch.Tensor) or initial.dim() < 1:
            raise CarryUsageError("Carried(initial) takes a tensor of one row per stream: [global_batch, ...]")
        self.initial = initial.detach().clone()
        self.value = initial.detach().clone()
        self.reset_each_epoch = reset_each_epoch
        self.name = "carried"
        self._binding: Any = None  # the script's trainer (script.ScriptTrainer)
        self._step = -1
        self._next: torch.Tensor | None = None  # rows written in this step (zeros elsewhere), then shared
        self._written: list[bool] = []
        self._shared = False

    # -- healed and checkpointed as registered state
    def state_dict(self) -> dict[str, Any]:
        """The rows after the last committed step."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the rows of a captured state (a heal's, a checkpoint's)."""
        value = state["value"]
        if tuple(value.shape) != tuple(self.value.shape):
            raise CarryUsageError(f"{self.name}: the saved rows are {tuple(value.shape)}, this run's "
                                  f"{tuple(self.value.shape)}: was the state saved with another global batch?")
        if value.data_ptr() != self.value.data_ptr():
            self.value.copy_(value)
        self._clear(-1)

    # -- the job's calls, inside the micro-batch loop
    def rows(self) -> list[int]:
        """The streams (rows) the current micro-batch holds, in its order."""
        trainer = self._bound()
        current = trainer.feed.current
        if current is None or current[0] != trainer.step:
            raise CarryUsageError(f"{self.name}.read() and .write() are called inside the loop over "
                                  f"step.micro_batches()")
        return [trainer.sampler.stream_of(i) for i in current[2]]

    def read(self) -> torch.Tensor:
        """The current micro-batch's rows as the step began (a new tensor)."""
        trainer, rows = self._bound(), self.rows()
        self._at(trainer.step)
        start = self.initial if self.reset_each_epoch and trainer.sampler.epoch_starts(trainer.step) else self.value
        return start[rows].clone()

    def write(self, rows: torch.Tensor) -> None:
        """The current micro-batch's new rows, one per stream it holds (detached: the graph of this
        step ends here, as truncated BPTT wants)."""
        trainer, index = self._bound(), self.rows()
        self._at(trainer.step)
        if not isinstance(rows, torch.Tensor) or tuple(rows.shape) != (len(index), *self.value.shape[1:]):
            got = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
            raise CarryUsageError(f"{self.name}.write() takes this micro-batch's rows, "
                                  f"{(len(index), *self.value.shape[1:])}, got {got}")
        assert self._next is not None
        self._next[index] = rows.detach().to(self._next.dtype)
        for r in index:
            self._written[r] = True

    # -- the runtime's calls (script.ScriptTrainer)
    def bind(self, trainer: Any, name: str) -> None:
        """Tie to the script's trainer, whose sampler must read streams."""
        if not callable(getattr(trainer.sampler, "stream_of", None)):
            raise CarryUsageError(f"{name} is a Carried state: loop over run.steps(loader, order='streams'), "
                                  f"whose global batch holds one window of each stream")
        if self.value.shape[0] != trainer.spec.global_batch:
            raise CarryUsageError(f"{name} has {self.value.shape[0]} rows but a step holds "
                                  f"{trainer.spec.global_batch} streams (training.global_batch): one row per stream")
        device = getattr(getattr(trainer, "group", None), "device", None)
        if device is not None and self.value.device != torch.device(device):  # the group's collective sums it there
            self.value, self.initial = self.value.to(device), self.initial.to(device)
        self._binding, self.name = trainer, name

    def share(self, rows_planned: list[int]) -> None:
        """Before the step's sum completes (once a step, on every rank): the rows this rank wrote,
        all of ``rows_planned``, summed over the group into every rank's copy."""
        trainer = self._bound()
        self._at(trainer.step)
        if self._shared:
            return
        missing = [r for r in rows_planned if not self._written[r]]
        if missing:
            raise CarryUsageError(f"step {trainer.step}: {self.name}.write() was not called for stream(s) "
                                  f"{missing[:8]}: call it once per micro-batch with its new rows")
        assert self._next is not None
        dist.all_reduce(self._next)
        self._next.add_(0.0)  # -0.0 -> +0.0 on every world size (a sum with zeros does it on some)
        self._shared = True

    def commit(self, step: int) -> None:
        """Step ``step`` committed: its shared rows become the value."""
        if self._step == step and self._shared and self._next is not None:
            self.value.copy_(self._next)
        self._clear(-1)

    def _at(self, step: int) -> None:
        if step != self._step:
            self._clear(step)

    def _clear(self, step: int) -> None:
        self._step, self._shared = step, False
        self._next = torch.zeros_like(self.value) if step >= 0 else None
        self._written = [False] * self.value.shape[0]

    def _bound(self) -> Any:
        if self._binding is None:
            raise CarryUsageError("a Carried state is registered with run.register(name=carried) and used inside "
                                  "run.steps(loader, order='streams')")
        return self._binding
