"""Moving an unusable store out of the way: renamed, never deleted, so an operator can inspect it."""

from __future__ import annotations

import os
import time
from pathlib import Path


def move_aside(path: Path) -> Path:
    """Rename a bad store out of the way (never delete it) and return where it went."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = Path(f"{path}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = Path(f"{path}.corrupt-{stamp}-{n}")
    os.rename(path, aside)
    return aside
