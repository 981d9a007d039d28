import datetime as dt

import pytest
import torch
import torch.distributed as dist

from dpeer.trainer.allreduce import (
    HookState,
    allreduce_step,
    current_group_hook,
    flatten_grads,
    unflatten_into_grads,
)
from tests.support.gloo import init_gloo


@pytest.fixture
def world1():
    """A fresh world-1 Gloo group per use; yields a function that re-forms it in place."""

    def form():
        if dist.is_initialized():
            dist.destroy_process_group()
        init_gloo(0, 1, store=dist.HashStore(), timeout=dt.timedelta(seconds=30))

    form()
    yield form
    if dist.is_initialized():
        dist.destroy_process_group()


def test_flatten_roundtrip_with_missing_grad():
    a = torch.nn.Parameter(torch.zeros(2, 3))
    b = torch.nn.Parameter(torch.zeros(4))
    a.grad = torch.arange(6.0).reshape(2, 3)
    flat = flatten_grads([a, b], extra=2, device=torch.device("cpu"))
    assert flat.shape == (12,)
    assert flat[:6].tolist() == list(range(6)) and flat[6:].abs().sum() == 0
    unflatten_into_grads(flat[:10] + 1, [a, b], 0.5)
    assert torch.equal(a.grad, (torch.arange(6.0).reshape(2, 3) + 1) * 0.5)
    assert torch.equal(b.grad, torch.full((4,), 0.5))


def test_allreduce_step_gives_mean_over_global_samples(world1):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum")
    loss.backward()
    red = allreduce_step(list(model.parameters()), float(loss.detach()), 5, 0, 1, 8, torch.device("cpu"))
    ref = torch.nn.Linear(3, 1)
    ref.load_state_dict(model.state_dict())
    torch.nn.functional.mse_loss(ref(x), y).backward()
    assert torch.allclose(model.weight.grad, ref.weight.grad, atol=1e-6)
    assert red.loss_mean == pytest.approx(float(loss.detach()) / 8)
    assert red.newest_seen_by_rank == [5]


def test_ddp_hook_follows_the_current_group(world1):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = HookState(global_samples=4)
    ddp.register_comm_hook(state, current_group_hook)
    x = torch.randn(4, 3)
    ddp(x).sum().backward()
    expected = x.sum(0).expand(2, 3) / 4
    assert torch.allclose(model.weight.grad, expected, atol=1e-6)
    world1()
    model.weight.grad = None
    model.bias.grad = None
    ddp(x).sum().backward()
    assert torch.allclose(model.weight.grad, expected, atol=1e-6)
