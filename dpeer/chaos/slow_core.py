"""A box slowed down: a cgroup (v1 cpu controller) whose processes get a fraction of one CPU.

What a box shared with other work looks like to dpeer: its worker computes at a fraction of the
speed of its neighbours. Used by scripts/bench_mixed.py and the real-process test of shares that
follow a slowed box (tests/integration/test_mixed_speeds.py). Needs root and the v1 cpu
controller at /sys/fs/cgroup/cpu (``why_not`` says so); the cgroup's name carries the creating
process's pid, and close() removes it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


def why_not() -> str | None:
    """Why a slowed cgroup cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "a cpu cgroup needs root"
    if not (ROOT / "cpu.cfs_quota_us").is_file():
        return f"no cgroup v1 cpu controller at {ROOT}"
    return None


class SlowCore:
    """A cgroup whose processes get ``fraction`` of one CPU (CFS quota), removed on close."""

    def __init__(self, fraction: float, tag: str = "slow") -> None:
        if not 0.01 <= fraction <= 1.0:
            raise ValueError(f"a slowed box gets 0.01 to 1 of a core, not {fraction}")
        self.path = ROOT / f"dpeer-{tag}-{os.getpid()}"
        self.path.mkdir()
        (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (self.path / "cpu.cfs_quota_us").write_text(str(int(PERIOD_US * fraction)))

    def prefix(self, core: int | None = None) -> list[str]:
        """What starts a command in the cgroup (pinned to ``core`` when given); its children (a
        daemon's worker and spares) inherit both."""
        pin = f"taskset -c {core} " if core is not None else ""
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec {pin}"$@"', "slow"]

    def close(self) -> None:
        """Remove the cgroup once the processes stopped in it are gone (they take a moment to exit)."""
        deadline = time.monotonic() + 30
        while (self.path / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            self.path.rmdir()
        except OSError as exc:
            print(f"could not remove {self.path}: {exc}", file=sys.stderr)
