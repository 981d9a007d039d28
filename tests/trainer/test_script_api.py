"""A script job's API in one process (issue 36): what a bad script or a bad data pipeline gets told,
and how the feed resumes a step after its loader was restarted."""

from __future__ import annotations

import traceback
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from dpeer.trainer.feed import FeedError, LoaderFeed
from dpeer.trainer.sampler import shard_bounds
from dpeer.trainer.step import Step, StepUsageError

MB = 4


class Numbers(Dataset):
    """Sample i is (i as a float vector, i); ``broken(i)`` says what a bad index does instead."""

    def __init__(self, n: int = 64, broken=None) -> None:
        self.n, self.broken = n, broken

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.broken is not None:
            odd = self.broken(i)
            if odd is not None:
                return odd
        return torch.full((2,), float(i)), i


def short(i: int):
    if i >= 40:
        raise IndexError(i)  # the dataset's own line: the error names it
    return None


def plan_for(world: int, rank: int):
    """Exact-style plan: 4 micro-batches a step of 4 samples each, contiguous, split over the world."""
    def plan(step: int):
        per = 4 // world
        return [(j, list(range(step * 16 + j * MB, step * 16 + (j + 1) * MB))) for j in range(rank * per, (rank + 1) * per)]
    return plan


def feed(dataset: Dataset, workers: int = 0) -> LoaderFeed:
    return LoaderFeed(DataLoader(dataset, batch_size=MB, num_workers=workers), MB, seed=1)


def test_a_step_resumed_after_its_loader_restarted_skips_what_it_already_has() -> None:
    f = feed(Numbers())
    f.replan(plan_for(1, 0))
    first = [f.get(0, j, ix)[1].tolist() for j, ix in plan_for(1, 0)(0)[:2]]
    f._it = None  # the loader was restarted (a worker died, then came back) with two micro-batches cached
    rest = [f.get(0, j, ix)[1].tolist() for j, ix in plan_for(1, 0)(0)[2:]]
    assert first + rest == [list(range(k, k + MB)) for k in range(0, 16, MB)]
    f.close()


def test_a_new_plan_in_the_middle_of_a_step_fetches_its_own_micro_batches() -> None:
    """A box left in the middle of step 0 (world 2 -> 1): the rank that had micro-batches 0 and 1 of
    it now needs all four; before, micro-batch 2 was refused ('the data loader gave (0, 0)')."""
    f = feed(Numbers())
    f.replan(plan_for(2, 0))
    for j, ix in plan_for(2, 0)(0):
        f.get(0, j, ix)
    f.replan(plan_for(1, 0))
    got = [f.get(0, j, ix)[1].tolist() for j, ix in plan_for(1, 0)(0)]
    assert got == [list(range(k, k + MB)) for k in range(0, 16, MB)]
    f.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_dataset_that_ends_early_is_one_line_naming_the_sample_and_its_line(workers: int) -> None:
    f = feed(Numbers(broken=short), workers)
    f.replan(plan_for(1, 0))
    f.get(0, 0, plan_for(1, 0)(0)[0][1])
    with pytest.raises(FeedError) as refused:
        for step in range(1, 4):
            for j, ix in plan_for(1, 0)(step):
                f.get(step, j, ix)
    said = str(refused.value)
    assert "\n" not in said and "Original Traceback" not in said, said
    assert "step 2 micro-batch 2: dataset[40] raised IndexError: 40" in said, said
    assert f"({__file__}, line" in said and "in short" in said, said
    assert "__getitem__ must serve every index below len(dataset), 64" in said, said
    f.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_samples_of_two_structures_are_named(workers: int) -> None:
    f = feed(Numbers(broken=lambda i: {"x": torch.zeros(2), "y": i} if i >= 6 else None), workers)
    f.replan(plan_for(1, 0))
    f.get(0, 0, plan_for(1, 0)(0)[0][1])
    with pytest.raises(FeedError) as refused:
        f.get(0, 1, plan_for(1, 0)(0)[1][1])
    said = str(refused.value)
    assert "\n" not in said and said.startswith("step 0 micro-batch 1: dataset[6] is ('dict'"), said
    assert "but dataset[4] is ('tuple'" in said and "every sample must have one structure" in said, said
    f.close()


def test_a_micro_batch_of_another_structure_is_refused() -> None:
    f = feed(Numbers(broken=lambda i: {"x": torch.zeros(2), "y": i} if i >= 16 else None))
    f.replan(plan_for(1, 0))
    for j, ix in plan_for(1, 0)(0):
        f.get(0, j, ix)
    with pytest.raises(FeedError, match="step 1 micro-batch 0: the data loader's batch is .*every batch must have one"):
        f.get(1, 0, plan_for(1, 0)(1)[0][1])
    f.close()


def test_a_step_that_skips_the_reduction_names_the_scripts_line() -> None:
    trainer = SimpleNamespace(stepper=SimpleNamespace(abort=lambda: None))
    step = Step(trainer, SimpleNamespace(rank=0, world=1), 3, True)  # type: ignore[arg-type]
    with step:
        pass  # no loop over step.micro_batches()
    assert isinstance(step.error, StepUsageError)
    where = traceback.extract_tb(step.error.__traceback__)
    assert where and where[-1].filename == __file__, where
    assert "step 3 ended before its gradients were reduced" in str(step.error) and __file__ in str(step.error)


def _evaluated(rank: int, world: int, count: int, batch: int) -> tuple[torch.Tensor, list[range]]:
    """step.evaluate on one rank of a simulated group: its sum is the other ranks' values (each the
    item's index squared) plus its own."""
    seen: list[range] = []

    def values(items: range) -> torch.Tensor:
        seen.append(items)
        return torch.tensor([float(i * i) for i in items])

    def all_sum(_seat: object, full: torch.Tensor) -> None:
        for r in range(world):
            if r != rank:
                other = _evaluated_part(r, world, count, batch)
                full += other

    trainer = SimpleNamespace(group=SimpleNamespace(device=torch.device("cpu")), all_sum=all_sum)
    step = Step(trainer, SimpleNamespace(rank=rank, world=world), 0, True)  # type: ignore[arg-type]
    step.reduction = SimpleNamespace()  # type: ignore[assignment]
    return step.evaluate(count, values, batch=batch), seen


def _evaluated_part(rank: int, world: int, count: int, batch: int) -> torch.Tensor:
    first, end = shard_bounds(-(-count // batch), rank, world)
    out = torch.zeros(count, dtype=torch.float64)
    for i in range(first * batch, min(end * batch, count)):
        out[i] = float(i * i)
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_a_sharded_evaluation_gives_every_item_in_order_in_whole_batches(world: int) -> None:
    full, seen = _evaluated(0, world, 10, 4)
    assert full.tolist() == [float(i * i) for i in range(10)]
    assert all(r.start % 4 == 0 and len(r) <= 4 for r in seen), seen  # the batches of a 1-box run


def test_an_evaluation_before_the_reduction_or_of_the_wrong_shape_is_refused() -> None:
    trainer = SimpleNamespace(group=SimpleNamespace(device=torch.device("cpu")), all_sum=lambda *_: None)
    step = Step(trainer, SimpleNamespace(rank=0, world=1), 2, True)  # type: ignore[arg-type]
    with pytest.raises(StepUsageError, match="runs after the loop over step.micro_batches"):
        step.evaluate(4, lambda items: torch.zeros(len(items)))
    step.reduction = SimpleNamespace()  # type: ignore[assignment]
    with pytest.raises(StepUsageError, match="must return a 1-d tensor of one value per item, not \\(4, 2\\)"):
        step.evaluate(4, lambda items: torch.zeros(len(items), 2), batch=4)
