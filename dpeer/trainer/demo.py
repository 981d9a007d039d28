"""The bundled demo job (``--job demo``): a small MLP classifying seeded synthetic data.

Everything is generated from the seed (no downloads): inputs are Gaussian, labels come from a
fixed random "teacher" network, so the task is learnable and every node builds the same data.
Options (all optional): steps, global_batch, micro_batch, dataset_len, dim, hidden, classes,
seed, lr, dtype (float32 or float64), dropout (a probability; 0: no dropout layers) and norm
(none, or batch: a BatchNorm1d after the first layer); the defaults build the plain MLP.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from dpeer.trainer.jobspec import RUN_DEFAULTS
from dpeer.trainer.job_api import JobContext, TrainSpec

DEFAULTS: dict[str, Any] = {
    **RUN_DEFAULTS,  # steps, global_batch, micro_batch, seed, lr: the config's training keys
    "dataset_len": 65536,
    "dim": 32,
    "hidden": 64,
    "classes": 10,
    "dtype": "float32",
    "dropout": 0.0,
    "norm": "none",
}
NORMS = ("none", "batch")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class SyntheticDataset:
    """Seeded Gaussian inputs with labels from a random teacher MLP."""

    def __init__(self, n: int, dim: int, classes: int, seed: int, dtype: torch.dtype = torch.float32) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        teacher_w1 = torch.randn(dim, 2 * dim, generator=g)
        teacher_w2 = torch.randn(2 * dim, classes, generator=g)
        self.y = (torch.tanh(self.x @ teacher_w1) @ teacher_w2).argmax(dim=1)
        self.x = self.x.to(dtype)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def collate(items: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack demo samples into a batch."""
    xs, ys = zip(*items)
    return torch.stack(xs), torch.stack(ys)


def build(ctx: JobContext) -> TrainSpec:
    """The demo job: ``job(ctx) -> TrainSpec``; each option typed by its default (``ctx.option``)."""
    o = {key: ctx.option(key, default) for key, default in DEFAULTS.items()}
    seed = o["seed"]
    if o["dtype"] not in DTYPES:
        raise ValueError(f"demo dtype must be one of {sorted(DTYPES)}, got {o['dtype']!r}")
    dtype = DTYPES[o["dtype"]]
    data = SyntheticDataset(o["dataset_len"], o["dim"], o["classes"], seed, dtype)
    if o["norm"] not in NORMS:
        raise ValueError(f"demo norm must be one of {list(NORMS)}, got {o['norm']!r}")
    torch.manual_seed(seed)
    hidden, dropout = o["hidden"], o["dropout"]
    def drop() -> list[torch.nn.Module]:
        return [torch.nn.Dropout(dropout)] if dropout > 0 else []

    norm = [torch.nn.BatchNorm1d(hidden)] if o["norm"] == "batch" else []
    model = torch.nn.Sequential(
        torch.nn.Linear(o["dim"], hidden), *norm, torch.nn.ReLU(), *drop(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), *drop(),
        torch.nn.Linear(hidden, o["classes"]),
    ).to(device=ctx.device, dtype=dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=0.9)
    return TrainSpec(
        model=model,
        optimizer=optimizer,
        dataset=data,
        loss_fn=lambda out, y: torch.nn.functional.cross_entropy(out, y, reduction="sum"),
        global_batch=o["global_batch"],
        micro_batch=o["micro_batch"],
        steps=o["steps"],
        seed=seed,
        collate=collate,
    )
