"""A step that fails inside a micro-batch (the job's code raising after the model's forward, before
its backward) is redone by the loop on the same replica (step.py: ``with step:`` keeps the failure,
the group re-forms and the same step comes again). The redo must start from the step's state: the
BatchNorm running statistics the failed forward updated must not become the redone step's start
values, or the run's bits differ from a fault-free run's (docs/exactness.md)."""

from __future__ import annotations

import pytest
import torch

from dpeer.trainer.exact import ExactStep
from dpeer.trainer.feed import InlineFeed
from dpeer.trainer.loop import default_collate
from tests.support.exact import demo, group, run_step, stepper  # noqa: F401 (group is a fixture)


def _fail_in_micro_batch(step: ExactStep, n_failing: int) -> None:
    """The planned step as the trainer runs it, its job code raising after micro-batch
    ``n_failing``'s forward; then what ``with step:`` does with the failure (Step.__exit__)."""
    spec = step.spec
    feed = InlineFeed(spec.dataset, spec.collate or default_collate)
    step.begin()
    with pytest.raises(RuntimeError, match="job failed"):
        for n, (j, indices) in enumerate(step.planned()):
            step.enter(n)
            x, y = feed.get(0, j, indices)
            loss = spec.loss_fn(spec.model(x), y)
            if n == n_failing:
                raise RuntimeError("the job failed after its forward")
            step.backward(loss)
            step.leave(n)
    step.abort()


def _run(fail_at: int | None, n_failing: int = 0) -> list[torch.Tensor]:
    spec = demo(norm="batch")
    step = stepper(spec)
    for s in range(3):
        step.plan(s, 0, 1)
        if s == fail_at:
            _fail_in_micro_batch(step, n_failing)
            step.plan(s, 0, 1)  # the loop plans the same step again in the re-formed group
        run_step(step)
        spec.optimizer.step()
    return [t.detach().clone() for t in [*spec.model.parameters(), *spec.model.buffers()]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n_failing", [0, 2])
def test_a_step_redone_after_a_failed_forward_has_the_fault_free_bits(group: None, n_failing: int) -> None:
    clean = _run(None)
    redone = _run(1, n_failing)
    assert len(clean) == len(redone)
    for a, b in zip(clean, redone):
        assert torch.equal(a, b), "the failed forward's BatchNorm update leaked into the redone step"
