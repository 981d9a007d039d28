"""The step's reduction overlapped with backward (overlap.py): buckets cover the buffer once, from
its end, aligned where the exact mode needs it, the control slots in the last; they are launched in
order however the gradients' hooks fire, only during an armed backward, and whatever backward left
(a parameter without a gradient) when it returns."""

from __future__ import annotations

import pytest
import torch

from dpeer.trainer.overlap import Bucket, GradViews, Overlap, plan_buckets


@pytest.mark.parametrize("grads,control,align", [(10_000_000, 7, 1024), (5_000, 3, 1), (0, 4, 1), (1024, 0, 1024),
                                                 (3_000_000, 100, 1)])
def test_buckets_cover_the_buffer_once_from_its_end(grads: int, control: int, align: int) -> None:
    buckets = plan_buckets(grads, control, 8, align, first_bytes=1 << 20, bucket_bytes=4 << 20)
    assert buckets[0].hi == control + grads and buckets[-1].lo == 0
    for a, b in zip(buckets, buckets[1:]):
        assert b.hi == a.lo and b.lo < b.hi
    assert all((b.lo - control) % align == 0 for b in buckets[:-1])
    if grads > (1 << 20) // 8:
        assert buckets[0].hi - buckets[0].lo <= (1 << 20) // 8 + align  # the first one small: it starts early


def model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))


def wire(net: torch.nn.Module, bucket_bytes: int) -> tuple[GradViews, list[int]]:
    params = list(net.parameters())
    flat = torch.zeros(sum(p.numel() for p in params) + 2)
    views = GradViews(params, flat[2:])
    views.bind()
    launched: list[int] = []
    buckets = plan_buckets(flat.numel() - 2, 2, 4, 1, first_bytes=bucket_bytes, bucket_bytes=bucket_bytes)
    overlap = Overlap(params, views.offsets, buckets, 2, lambda k, b: launched.append(k))
    return views, launched, overlap, buckets  # type: ignore[return-value]


def test_buckets_launch_in_order_during_an_armed_backward_only() -> None:
    net = model()
    views, launched, overlap, buckets = wire(net, 4096)
    assert len(buckets) >= 4
    net(torch.randn(4, 64)).sum().backward()
    assert launched == [], "an unarmed backward (an earlier micro-batch) launches nothing"
    overlap.arm()
    net(torch.randn(4, 64)).sum().backward()
    assert launched == list(range(len(buckets))), launched
    overlap.finish()
    assert launched == list(range(len(buckets))), "finish launches nothing twice"
    assert all(p.grad is v for p, v in zip(net.parameters(), views.views)), "gradients stay views of the buffer"


def test_a_parameter_without_a_gradient_holds_its_bucket_until_backward_returns() -> None:
    net = model()
    _views, launched, overlap, buckets = wire(net, 4096)
    overlap.arm()
    net[2](torch.randn(4, 64)).sum().backward()  # the first two layers get no gradient
    got = list(launched)
    overlap.finish()
    assert got == list(range(len(got))) and launched == list(range(len(buckets))) and len(got) < len(buckets)


def test_a_disarmed_step_launches_nothing_and_closing_removes_the_hooks() -> None:
    net = model()
    _views, launched, overlap, _ = wire(net, 4096)
    overlap.arm()
    overlap.disarm()
    net(torch.randn(4, 64)).sum().backward()
    overlap.close()
    overlap.arm()
    net(torch.randn(4, 64)).sum().backward()
    assert launched == []


def test_a_parameter_of_another_dtype_is_loose_and_copied() -> None:
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    flat = torch.zeros(5)
    views = GradViews([a, b], flat)
    assert views.loose == [(b, 3)] and views.views[0] is not None
    views.bind()
    (a.sum() * 2 + b.sum() * 3).backward()
    views.gather_loose()
    assert flat.tolist() == [2, 2, 2, 3, 3]
    flat.mul_(0.5)
    views.scatter_loose()
    assert b.grad.dtype == torch.float64 and b.grad.tolist() == [1.5, 1.5] and a.grad.tolist() == [1, 1, 1]


def test_a_collective_that_fails_in_its_wait_is_the_groups_failure_not_the_jobs() -> None:
    """Work.wait raises from C++, with no torch.distributed frame: unwrapped, a dead peer would read as
    the job's own error ("train") and, repeated, halt the job as broken."""
    from dpeer.trainer.decisions import classify_failure
    from dpeer.trainer.group import GroupError
    from dpeer.trainer.overlap import wait_all

    class Broken:
        def wait(self) -> None:
            raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer\nmore")

    with pytest.raises(GroupError, match="Connection closed by peer") as failed:
        wait_all([Broken()])
    assert classify_failure(failed.value, 7, isinstance(failed.value, GroupError)).phase == "group"


class Shared(torch.nn.Module):
    """One layer applied twice, each application a reentrant checkpoint segment: its backward runs
    once per segment, so the layer's gradient is accumulated twice, the first layer's after both."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.shared, self.out = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        for _ in range(2):
            h = torch.utils.checkpoint.checkpoint(lambda t: torch.relu(self.shared(t)), h, use_reentrant=True)
        return self.out(h)


def test_a_gradient_accumulated_twice_counts_once_and_its_bucket_waits_for_the_others() -> None:
    """Counted at each accumulation, the twice-accumulated layer made its bucket (here the whole
    buffer) look ready before the first layer's gradient was in it: the sum sent lacked it."""
    net = Shared()
    params = list(net.parameters())
    flat = torch.zeros(sum(p.numel() for p in params) + 2)
    views = GradViews(params, flat[2:])
    views.bind()
    sent: list[torch.Tensor] = []
    buckets = plan_buckets(flat.numel() - 2, 2, 4, 1, first_bytes=1 << 20, bucket_bytes=1 << 20)
    overlap = Overlap(params, views.offsets, buckets, 2, lambda k, b: sent.append(flat[b.lo : b.hi].clone()))
    overlap.arm()
    net(torch.randn(4, 64)).sum().backward()
    overlap.finish()
    assert len(sent) == len(buckets) == 1
    assert torch.equal(sent[0], flat) and bool(net.first.weight.grad.ne(0).any()), "a bucket left before its gradients"


def test_a_gradient_accumulated_again_after_its_bucket_left_is_refused() -> None:
    """In buckets small enough that the twice-accumulated layer's leave after its first
    accumulation, the second would change what was already sent: backward raises, not a wrong sum."""
    from dpeer.trainer.overlap import TwiceAccumulated

    net = Shared()
    params = list(net.parameters())
    flat = torch.zeros(sum(p.numel() for p in params) + 2)
    GradViews(params, flat[2:]).bind()
    buckets = plan_buckets(flat.numel() - 2, 2, 4, 1, first_bytes=4096, bucket_bytes=4096)
    overlap = Overlap(params, GradViews(params, flat[2:]).offsets, buckets, 2, lambda k, b: None)
    overlap.arm()
    with pytest.raises(TwiceAccumulated, match="use_reentrant=False"):
        net(torch.randn(4, 64)).sum().backward()
