"""What exact reduction (exact.py) asks of the worker's process and of a job: deterministic kernels,
a step of whole equal micro-batches, no SyncBatchNorm; and the errors it raises when refused."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from dpeer.trainer import fixedpoint as fx

if TYPE_CHECKING:
    from dpeer.trainer.job_api import TrainSpec


class ExactModeError(ValueError):
    """The job cannot train with exact reduction; the text says why and what to do instead."""


class NonFiniteGradient(ArithmeticError):
    """A micro-batch's gradient holds a NaN or an Inf; raised on every rank at the same step."""


def configure_process(threads: int = 0) -> None:
    """Kernel-side determinism for exact mode: deterministic algorithms, no cuDNN autotuning, the
    cuBLAS workspace that deterministic CUDA matmuls need, and ``threads`` intra-op threads (0 keeps
    torch's default, the box's core count, equal on boxes of one kind)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    if threads > 0:
        torch.set_num_threads(threads)


def check_spec(spec: TrainSpec) -> int:
    """The number of micro-batches per step, or ExactModeError for a job exact mode cannot run."""
    if spec.global_batch % spec.micro_batch:
        raise ExactModeError(
            f"exact reduction needs global_batch ({spec.global_batch}) to be a multiple of micro_batch "
            f"({spec.micro_batch}): a step is a fixed sequence of equal micro-batches")
    count = spec.global_batch // spec.micro_batch
    if count > fx.MAX_MICRO_BATCHES:
        raise ExactModeError(f"exact reduction sums at most {fx.MAX_MICRO_BATCHES} micro-batches per step, "
                             f"got {count}: raise micro_batch")
    for name, module in spec.model.named_modules():
        if isinstance(module, torch.nn.SyncBatchNorm):
            raise ExactModeError(f"module {name!r} is a SyncBatchNorm, whose forward synchronises ranks; exact "
                                 f"reduction runs each micro-batch alone and combines BatchNorm statistics itself: "
                                 f"use BatchNorm")
    return count
