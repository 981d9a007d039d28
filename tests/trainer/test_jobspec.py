"""The job API's build pass: a mean-reduced loss trains to the sum-reduced one's parameters, a
mismatch between the loss and what the spec declares is refused, options are typed, and the
run shape must be the config's."""

from __future__ import annotations

import pytest
import torch

from dpeer.trainer.demo import build
from dpeer.trainer.exact import ExactStep
from dpeer.trainer.jobspec import JobSpecError, LossReduction, prepare
from dpeer.trainer.loop import JobContext, TrainSpec, default_collate
from dpeer.trainer.sampler import GlobalBatchSampler
from dpeer.trainer.stepping import FastStep
from tests.support.exact import group, run_step  # noqa: F401 (group is a fixture)

CPU = torch.device("cpu")
OPTIONS = {"dataset_len": 256, "global_batch": "16", "micro_batch": "4", "steps": "6"}


def spec_with(loss: torch.nn.Module | None = None, reduction: str = "sum") -> tuple[TrainSpec, JobContext]:
    ctx = JobContext("a", CPU, dict(OPTIONS))
    spec = build(ctx)
    if loss is not None:
        spec.loss_fn, spec.loss_reduction = loss, reduction
    return spec, ctx


def train(spec: TrainSpec, stepper_kind: type, steps: int) -> list[torch.Tensor]:
    sampler = GlobalBatchSampler(len(spec.dataset), spec.global_batch, spec.seed)
    params = [p for p in spec.model.parameters() if p.requires_grad]
    step = stepper_kind(spec, params, sampler, CPU)
    for i in range(steps):
        step.plan(i, 0, 1)
        run_step(step)
        spec.optimizer.step()
    return [p.detach().clone() for p in spec.model.parameters()]


@pytest.mark.parametrize("stepper_kind", [ExactStep, FastStep])
def test_a_mean_reduced_loss_trains_to_the_sum_reduced_parameters(group: None, stepper_kind: type) -> None:
    summed, ctx = spec_with()
    mean, mctx = spec_with(torch.nn.CrossEntropyLoss(), "mean")
    start = [p.detach().clone() for p in summed.model.parameters()]
    a = train(prepare(summed, ctx, summed.collate), stepper_kind, 6)
    b = train(prepare(mean, mctx, mean.collate), stepper_kind, 6)
    assert not all(torch.equal(x, y) for x, y in zip(a, start)), "nothing trained"
    for x, y in zip(a, b):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6)


def test_a_mean_reduced_loss_declared_as_a_sum_is_refused_in_one_sentence() -> None:
    spec, ctx = spec_with(torch.nn.CrossEntropyLoss())  # torch's default reduction, the usual slip
    with pytest.raises(JobSpecError, match=r"returns the mean over the batch .* loss_reduction='sum': pass "
                       r"reduction='sum'"):
        prepare(spec, ctx, spec.collate)
    spec, ctx = spec_with(torch.nn.CrossEntropyLoss(reduction="sum"), "mean")
    with pytest.raises(JobSpecError, match="returns the sum over the batch"):
        prepare(spec, ctx, spec.collate)
    spec, ctx = spec_with(torch.nn.CrossEntropyLoss(reduction="none"))
    with pytest.raises(JobSpecError, match=r"one number \(a 0-dim tensor\), got \(2,\)"):
        prepare(spec, ctx, spec.collate)


def test_the_probe_leaves_the_model_as_it_was() -> None:
    spec, ctx = spec_with()
    before = {k: v.clone() for k, v in spec.model.state_dict().items()}
    prepare(spec, ctx, spec.collate)
    assert spec.model.training and spec.loss_reduction is LossReduction.SUM
    assert all(torch.equal(before[k], v) for k, v in spec.model.state_dict().items())


def test_options_are_typed_by_their_default_and_a_bad_one_names_its_key() -> None:
    ctx = JobContext("a", CPU, {"lr": "0.5", "epochs": "3", "amp": "true", "name": "x", "bad": "abc"})
    assert (ctx.option("lr", 0.1), ctx.option("epochs", 1), ctx.option("amp", False), ctx.option("name", "")) == \
        (0.5, 3, True, "x")
    assert ctx.option("absent", 7) == 7 and ctx.lr == 0.5 and ctx.steps == 20000
    with pytest.raises(JobSpecError, match=r"job option bad='abc' is not an int \(set it in training.options"):
        ctx.option("bad", 1)


@pytest.mark.parametrize("change, message", [
    ({"steps": 5}, r"TrainSpec.steps is 5 but the config's training.steps is 6: pass ctx.steps"),
    ({"micro_batch": 32}, r"micro_batch \(32\) is larger than global_batch \(16\)"),
    ({"global_batch": 0}, "global_batch must be a positive int"),
    ({"loss_reduction": "avg"}, "loss_reduction must be 'sum' or 'mean'"),
    ({"optimizer": torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)}, "holds tensors that are not"),
])
def test_a_spec_the_runtime_would_train_wrongly_is_refused(change: dict, message: str) -> None:
    spec, ctx = spec_with()
    for key, value in change.items():
        setattr(spec, key, value)
    with pytest.raises(JobSpecError, match=message):
        prepare(spec, ctx, spec.collate)


def test_the_run_defaults_a_job_sees_are_the_configs() -> None:
    from dpeer.daemon.config import TrainingConfig
    from dpeer.trainer.jobspec import RUN_DEFAULTS

    assert RUN_DEFAULTS == {k: getattr(TrainingConfig(), k) for k in RUN_DEFAULTS}
