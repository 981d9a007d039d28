"""Exact mode reads the dataset inside a micro-batch's seeded streams: a dataset with random
augmentation (torchvision's RandomCrop and RandomHorizontalFlip draw from torch's generator)
draws the same for a micro-batch whichever rank runs it and whatever that rank ran before, so a
run at another world size or with failures ends with the same bits (an outside tester found the
dataset read outside the streams, from the rank's own history)."""

from __future__ import annotations

import torch

from tests.support.exact import demo, grads, group, run_step, stepper  # noqa: F401 (group is a fixture)


class Augmented:
    """A dataset that adds random noise to each sample, as a random augmentation does."""

    def __init__(self, base: object) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.base[i]  # type: ignore[index]
        return x + 0.1 * torch.randn_like(x), y


def test_a_randomly_augmented_dataset_draws_the_same_whatever_the_ranks_history(group: None) -> None:  # noqa: F811
    spec = demo()
    spec.dataset = Augmented(spec.dataset)
    step = stepper(spec)
    torch.manual_seed(1)
    step.plan(3, 0, 1)
    run_step(step)
    first = grads(spec)
    torch.manual_seed(999)  # another history: another rank, or the same step redone after a failure
    step.plan(3, 0, 1)
    run_step(step)
    assert all(torch.equal(a, b) for a, b in zip(first, grads(spec))), \
        "step 3's gradient depends on the global generator's state: the dataset's draws are not seeded"
