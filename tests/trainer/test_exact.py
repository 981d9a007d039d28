"""ExactStep in one process (a 1-rank Gloo group): what it refuses at build, how it combines
BatchNorm statistics, its random streams, the redo when gradients outgrow their exponents, and the
NaN/Inf error. The multi-rank equalities are in test_exact_multiprocess.py."""

from __future__ import annotations

import pytest
import torch

from dpeer.trainer.demo import DEFAULTS
from dpeer.trainer.exact import ExactModeError, NonFiniteGradient
from dpeer.trainer.loop import default_collate
from dpeer.trainer.sampler import GlobalBatchSampler
from tests.support.exact import demo, grads, group, run_step, stepper  # noqa: F401 (group is a fixture)


def test_a_global_batch_that_is_not_a_multiple_of_the_micro_batch_is_refused() -> None:
    with pytest.raises(ExactModeError, match=r"global_batch \(16\) to be a multiple of micro_batch \(5\)"):
        stepper(demo(micro_batch=5))


class Counter(torch.nn.Module):
    """Counts its forwards in a buffer: state exact reduction cannot combine."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x


def test_a_buffer_that_forward_changes_is_refused_at_build_but_batchnorm_is_not() -> None:
    spec = demo(norm="batch")
    stepper(spec)  # BatchNorm statistics are combined, not refused
    spec.model = torch.nn.Sequential(Counter(), spec.model)
    with pytest.raises(ExactModeError, match=r"changes buffer\(s\) 0\.calls.*training\.reduction: fast"):
        stepper(spec)
    assert float(spec.model[0].calls) == 1.0  # the probe ran it once


def test_sync_batchnorm_is_refused() -> None:
    spec = demo()
    spec.model = torch.nn.Sequential(torch.nn.SyncBatchNorm(32), spec.model)
    with pytest.raises(ExactModeError, match="SyncBatchNorm"):
        stepper(spec)


def test_batchnorm_statistics_are_the_mean_of_the_micro_batches_updates(group: None) -> None:
    spec = demo(norm="batch")
    bn = spec.model[1]
    start_mean, start_var = bn.running_mean.clone(), bn.running_var.clone()
    step = stepper(spec)
    step.plan(0, 0, 1)
    run_step(step)
    indices = step.sampler.indices_for_step(0)
    means, variances = [], []
    for j in range(4):
        x, _ = default_collate([spec.dataset[i] for i in indices[4 * j : 4 * j + 4]])
        h = spec.model[0](x).detach().double()
        means.append((1 - bn.momentum) * start_mean.double() + bn.momentum * h.mean(0))
        variances.append((1 - bn.momentum) * start_var.double() + bn.momentum * h.var(0, unbiased=True))
    assert torch.allclose(bn.running_mean.double(), sum(means) / 4, rtol=1e-6, atol=1e-7)
    assert torch.allclose(bn.running_var.double(), sum(variances) / 4, rtol=1e-6, atol=1e-7)
    assert int(bn.num_batches_tracked) == 1  # one update per step, not per micro-batch


def test_dropout_draws_depend_on_the_step_and_micro_batch_only(group: None) -> None:
    spec = demo(dropout=0.5)
    step = stepper(spec)
    before = torch.get_rng_state()
    step.plan(3, 0, 1)
    run_step(step)
    first = grads(spec)
    assert torch.equal(torch.get_rng_state(), before), "the micro-batches' seeding leaked into the global stream"
    torch.manual_seed(999)  # another history
    step.plan(3, 0, 1)
    run_step(step)
    assert all(torch.equal(a, b) for a, b in zip(first, grads(spec)))
    step.plan(4, 0, 1)
    run_step(step)
    assert not all(torch.equal(a, b) for a, b in zip(first, grads(spec)))


def test_gradients_that_outgrew_their_exponents_are_summed_again(group: None) -> None:
    fresh_spec, spec = demo(), demo()
    fresh = stepper(fresh_spec)
    fresh.plan(0, 0, 1)
    run_step(fresh)
    assert fresh.redos == 1  # the first step measures its exponents
    step = stepper(spec)
    step.load_state({"exponents": [-60] * step.nb})  # far too small for the demo's gradients
    step.plan(0, 0, 1)
    run_step(step)
    assert step.redos == 1
    assert all(torch.equal(a, b) for a, b in zip(grads(fresh_spec), grads(spec)))
    assert step.state() == fresh.state()
    step.plan(1, 0, 1)
    run_step(step)
    assert step.redos == 1, "a steady step needed a redo"


class Poisoned(torch.utils.data.Dataset):
    def __init__(self, base: torch.utils.data.Dataset, bad: int) -> None:
        self.base, self.bad = base, bad

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.base[i]
        return (torch.full_like(x, float("inf")) if i == self.bad else x), y


def test_a_nan_or_inf_gradient_raises_a_clear_error(group: None) -> None:
    spec = demo()
    sampler = GlobalBatchSampler(len(spec.dataset), spec.global_batch, spec.seed)
    spec.dataset = Poisoned(spec.dataset, sampler.indices_for_step(2)[9])
    step = stepper(spec)
    for s in range(2):
        step.plan(s, 0, 1)
        run_step(step)
    step.plan(2, 0, 1)
    with pytest.raises(NonFiniteGradient, match=r"step 2: the gradient of parameter 0\.weight .* is NaN or Inf"):
        run_step(step)


def test_demo_defaults_are_exact_compatible() -> None:
    assert DEFAULTS["global_batch"] % DEFAULTS["micro_batch"] == 0


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_bucket_wire_buffers_reused_in_flight_give_the_same_bits(group: None, micro_batches: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A model of several overlap buckets (1.1M parameters): a rank with one micro-batch sums in a
    pool of bucket-sized wire buffers, and with one buffer in the pool each launch waits for the
    previous bucket's sum and finishes it into the gradients during backward; the bits equal those of
    a pool as large as the model, step after step (the first measures, the others overlap); with
    three micro-batches (the whole-model sum) likewise."""
    from dpeer.trainer import exact_sums

    options = {"dim": 64, "hidden": 1024, "global_batch": 4 * micro_batches}
    results = []
    for slots in (1, 64):
        monkeypatch.setattr(exact_sums, "WIRE_SLOTS", slots)
        spec = demo(**options)
        step = stepper(spec)
        out = []
        for s in range(3):
            step.plan(s, 0, 1)
            run_step(step)
            out.append(grads(spec))
            spec.optimizer.step()
        assert step.redos == 1 and len(step._sums.plan) >= 3
        results.append(out)
    for a, b in zip(*results):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert any(bool(g.abs().sum() > 0) for g in results[0][-1])


class _Cast(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)


def test_a_loose_gradient_is_each_micro_batchs_own(group: None) -> None:
    """A float32 parameter in a model with float64 ones keeps a gradient of its own (it is loose),
    copied into the row after each micro-batch: each copy is that micro-batch's gradient alone, not
    the sum since the step began (or since the last step's mean), so the mean gradient is the
    global batch's, step after step, with no zero_grad between them."""
    spec = demo(global_batch=8, micro_batch=4)
    dim, hidden = spec.model[0].in_features, spec.model[0].out_features
    torch.manual_seed(3)
    spec.model = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(), _Cast(torch.float64),
                                     torch.nn.Linear(hidden, 10).double(), _Cast(torch.float32))
    step = stepper(spec)
    assert step.grads.loose, "the float32 layer should be loose next to the float64 one"
    for s in range(2):
        step.plan(s, 0, 1)
        run_step(step)
        got = [p.grad.clone() for p in spec.model.parameters()]
        x, y = default_collate([spec.dataset[i] for i in step.sampler.indices_for_step(s)])
        ref = torch.nn.Sequential(*spec.model)  # the same modules, gradients computed afresh
        params = list(ref.parameters())
        want = torch.autograd.grad(spec.loss_fn(ref(x), y) / spec.global_batch, params)
        for g, w in zip(got, want):
            assert torch.allclose(g.double(), w.double(), rtol=1e-5, atol=1e-9), s
