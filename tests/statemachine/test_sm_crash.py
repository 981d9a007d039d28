"""Real processes: SIGKILL a durable appender at random moments; nothing acknowledged is lost.

About 8 kills by default; DPEER_SLOW=1 runs 60 (20 each while appending, applying, snapshotting).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.sm_entries import expected_entry, expected_kv

from dpeer.statemachine.store import Store

HERE = Path(__file__).parent
REPO = HERE.parent.parent
KILLS = 20 if os.environ.get("DPEER_SLOW") == "1" else 3


def run_and_kill(path: Path, mode: str, rng: random.Random) -> int:
    """Start the child, SIGKILL it after a random number of acks; return the highest acked index."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(HERE)]))
    child = subprocess.Popen([sys.executable, str(HERE / "sm_crash_child.py"), str(path), mode,
                              str(rng.randrange(1 << 30))], stdout=subprocess.PIPE, env=env)
    assert child.stdout is not None
    acked, want = 0, rng.randint(1, 60)
    try:
        for n, line in enumerate(child.stdout, 1):
            assert line.startswith(b"A "), line
            acked = int(line.split()[1])
            if n >= want:
                child.send_signal(signal.SIGKILL)
                break
        for line in child.stdout.read().splitlines(keepends=True):
            if line.startswith(b"A ") and line.endswith(b"\n"):
                acked = int(line.split()[1])  # printed (so acknowledged) before the kill landed
    finally:
        child.kill()
        assert child.wait(timeout=60) == -signal.SIGKILL
        child.stdout.close()
    return acked


def check(path: Path, acked: int) -> None:
    """The store opens cleanly and holds every acknowledged entry and a consistent applied state."""
    with Store.open(path) as s:
        assert s.recovered_from is None
        assert s.last_index >= acked
        assert s.entries(s.first_index, s.last_index + 1) == [
            expected_entry(i) for i in range(s.first_index, s.last_index + 1)]
        assert s.snapshot_index >= s.first_index - 1
        s.apply_to(s.commit_index)
        assert s.last_applied == s.commit_index
        assert dict(s.state.kv) == expected_kv(s.last_applied)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["append", "apply", "snapshot"])
def test_sigkill_loses_no_acknowledged_entry(tmp_path: Path, mode: str) -> None:
    rng = random.Random(f"crash-{mode}")
    path = tmp_path / "s"
    high = 0
    for _ in range(KILLS):
        acked = run_and_kill(path, mode, rng)
        assert acked >= high, "acks only grow across restarts"
        high = acked
        check(path, acked)
    assert high > 0
