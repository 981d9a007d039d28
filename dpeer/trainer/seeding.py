"""Torch's generators seeded for one micro-batch of an exact step (exact.py) and put back after, so
its random stream depends on (seed, step, micro-batch) alone and the job's own stream goes on."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


def seed_rng(seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Seed torch's generators (CPU, and ``device``'s when it is a GPU) to ``seed``; returns their
    states before, for ``restore_rng``. torch.manual_seed is not used: it queues a seeding of every
    CUDA, XPU and MTIA device, recording a Python traceback for each even on a CPU-only box (0.5 ms
    a call here, 50 % of a demo step's exact-mode cost)."""
    saved = (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)
    torch.default_generator.manual_seed(seed)
    if saved[1] is not None:
        torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()].manual_seed(seed)
    return saved


def restore_rng(saved: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    """Put back the generator states ``seed_rng`` returned."""
    torch.set_rng_state(saved[0])
    if saved[1] is not None:
        torch.cuda.set_rng_state(saved[1], device)


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Run with torch's generators seeded to ``seed``, then put their states back (fork_rng, without
    its per-call device scan)."""
    saved = seed_rng(seed, device)
    try:
        yield
    finally:
        restore_rng(saved, device)
