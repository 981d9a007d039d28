"""Gloo groups that tests form without GroupManager, with torch._dynamo imported first as
dpeer.trainer.group does: a group alive at its first import is not released by
destroy_process_group and can abort the process as it exits (exit -6)."""

from __future__ import annotations

from typing import Any

import torch._dynamo  # noqa: F401
import torch.distributed as dist


def init_gloo(rank: int, world: int, **kwargs: Any) -> None:
    """``dist.init_process_group("gloo", ...)`` once torch._dynamo is imported."""
    dist.init_process_group("gloo", rank=rank, world_size=world, **kwargs)
