"""A small CNN that tells four shapes apart in generated 28x28 images, trained as a dpeer script job.

    dpeer demo --job examples/vision/train.py --nodes 3 --steps 200 --chaos

The images are drawn from the run's seed (a square, a disk, a cross or a ring, placed and sized
at random, with noise), so every box builds the same data without a download. What it shows:
augmentation inside the dataset (a random flip and a random crop drawn from torch's generator,
which dpeer seeds per micro-batch in the DataLoader's worker processes, so it is exact too),
bf16 autocast on CPU around the forward, BatchNorm, and a ReduceLROnPlateau stepped by the
held-out accuracy, which every rank computes and so agrees on.

Options (``training.options``): train_images (2048), held_out (256), eval_every (20), patience (2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import dpeer.job as dj

SIZE, PAD, CLASSES = 28, 2, 4


def shape_mask(kind: int, cy: float, cx: float, r: float) -> torch.Tensor:
    """A SIZE x SIZE mask of shape ``kind`` centred at (cy, cx) with radius ``r``."""
    y, x = torch.meshgrid(torch.arange(SIZE, dtype=torch.float32), torch.arange(SIZE, dtype=torch.float32),
                          indexing="ij")
    dy, dx = (y - cy).abs(), (x - cx).abs()
    if kind == 0:  # a filled square
        return (torch.maximum(dy, dx) <= r).float()
    dist = (dy ** 2 + dx ** 2).sqrt()
    if kind == 1:  # a disk
        return (dist <= r).float()
    if kind == 2:  # a cross
        return (((dy <= r / 4) & (dx <= r)) | ((dx <= r / 4) & (dy <= r))).float()
    return ((dist <= r) & (dist >= r * 0.6)).float()  # a ring


def draw(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` noisy images (count x 1 x SIZE x SIZE) and their labels, from ``seed`` alone."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (count,), generator=g)
    images = torch.empty(count, 1, SIZE, SIZE)
    for i, kind in enumerate(labels.tolist()):
        r = 4.0 + 5.0 * torch.rand(1, generator=g).item()
        cy, cx = (r + (SIZE - 2 * r) * torch.rand(2, generator=g)).tolist()
        images[i, 0] = shape_mask(kind, cy, cx, r) + 0.3 * torch.randn(SIZE, SIZE, generator=g)
    return images, labels


class Shapes(torch.utils.data.Dataset):
    """Generated images; with ``augment``, each fetch flips at random and crops a random window
    of the padded image, drawing from torch's global generator."""

    def __init__(self, count: int, seed: int, augment: bool) -> None:
        self.images, self.labels = draw(count, seed)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[i]
        if self.augment:
            if torch.rand(1).item() < 0.5:
                image = image.flip(-1)
            dy, dx = torch.randint(0, 2 * PAD + 1, (2,)).tolist()
            image = F.pad(image, (PAD, PAD, PAD, PAD))[:, dy:dy + SIZE, dx:dx + SIZE]
        return image, self.labels[i]


def convnet() -> torch.nn.Module:
    """Two conv-BatchNorm-ReLU-pool stages and a linear classifier."""
    def stage(cin: int, cout: int) -> list[torch.nn.Module]:
        return [torch.nn.Conv2d(cin, cout, 3, padding=1), torch.nn.BatchNorm2d(cout), torch.nn.ReLU(),
                torch.nn.MaxPool2d(2)]
    return torch.nn.Sequential(*stage(1, 16), *stage(16, 32), torch.nn.Flatten(),
                               torch.nn.Linear(32 * (SIZE // 4) ** 2, CLASSES))


def logits_of(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The forward under bf16 autocast on the CPU; the logits come back as float32."""
    with torch.autocast(images.device.type, dtype=torch.bfloat16):
        return model(images).float()


@torch.no_grad()
def accuracy(model: torch.nn.Module, held_out: Shapes, device: str) -> float:
    """The fraction of held-out images classified right (BatchNorm in eval mode)."""
    model.eval()
    hits = (logits_of(model, held_out.images.to(device)).argmax(1) == held_out.labels.to(device)).sum().item()
    model.train()
    return hits / len(held_out)


def main() -> None:
    """Build the data, the model, its optimizer and schedule, then train every step of the run."""
    run = dj.connect()
    train = Shapes(run.option("train_images", 2048), run.seed, augment=True)
    held_out = Shapes(run.option("held_out", 256), run.seed + 1, augment=False)

    torch.manual_seed(run.seed)
    model = convnet().to(run.device)
    opt = torch.optim.SGD(model.parameters(), lr=run.lr, momentum=0.9)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5,
                                                         patience=run.option("patience", 2))
    run.register(model=model, optimizer=opt, plateau=plateau)

    loader = torch.utils.data.DataLoader(train, batch_size=run.micro_batch, num_workers=2, persistent_workers=True)
    every = run.option("eval_every", 20)
    for step in run.steps(loader, loss="mean"):
        with step:
            for images, labels in step.micro_batches():
                step.backward(F.cross_entropy(logits_of(model, images.to(run.device)), labels.to(run.device)))
            opt.step()
            if (step.number + 1) % every == 0:
                acc = accuracy(model, held_out, run.device)
                plateau.step(acc)  # the same accuracy on every rank, so the same decision
                if run.is_writer:
                    print(f"vision step {step.number + 1}/{run.total_steps}: held-out accuracy {acc:.3f}, "
                          f"lr {opt.param_groups[0]['lr']:.4f}, world {step.world}", flush=True)
    run.finish()


if __name__ == "__main__":
    main()
