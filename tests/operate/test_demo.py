"""The README's first command, as a new user runs it (shortened): `dpeer demo` trains to the end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_runs_a_local_cluster_to_the_last_step(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dpeer.peer.cli", "demo", "--nodes", "2", "--steps", "80", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "training finished: every replica ran all steps" in result.stdout
    assert "step 80/80" in result.stdout
    for node in ("n1", "n2"):
        assert (tmp_path / node / "worker" / "final.pt").exists(), f"{node} did not finish its job"


def test_demo_refuses_absurd_sizes() -> None:
    result = subprocess.run([sys.executable, "-m", "dpeer.peer.cli", "demo", "--nodes", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--nodes" in result.stderr
