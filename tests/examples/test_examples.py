"""The example scripts in examples/ train as dpeer script jobs (issue 36): each one, on a 3-box
`dpeer demo --chaos` that kills and restarts boxes, ends with the same parameters (the final
digest) as the same script trained fault-free on one box, and the DataLoader's worker processes
really run beside the dpeer worker.

The demo's chaos schedule kills a box 12 s after the daemons start, then every 12 s, so each run
must last past that: the step counts below do on this 2-core machine. A machine fast enough to
finish first (or end just as the first kill lands, before the survivors' next step) gets one retry
with three times the steps, so the kill is never skipped silently.
The workers run one intra-op thread each (DPEER_TRAINING__THREADS=1): three boxes on two cores
with torch's default threads spend most of their time waiting on each other's spinning threads.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 240.0
STEPS = {"lm": 150, "vision": 200, "hf": 60}  # long enough for the first kill, short enough for CI


def demo_env() -> dict[str, str]:
    """The user's environment without DPEER_* keys, this checkout on PYTHONPATH, one thread a worker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPEER_")}
    return {**env, "PYTHONPATH": str(REPO), "DPEER_TRAINING__THREADS": "1"}


def demo_cmd(name: str, nodes: int, steps: int, folder: Path, chaos: bool) -> list[str]:
    """`dpeer demo --job examples/NAME/train.py ... --json` as a command line."""
    return [sys.executable, "-m", "dpeer.cli.main", "demo", "--job", f"examples/{name}/train.py", "--nodes",
            str(nodes), "--steps", str(steps), "--json", "--dir", str(folder), *(["--chaos"] if chaos else [])]


def train(name: str, nodes: int, steps: int, folder: Path, chaos: bool = False) -> dict:
    """Run the demo to its end; its --json end line (the run must have exited 0)."""
    result = subprocess.run(demo_cmd(name, nodes, steps, folder, chaos), capture_output=True, text=True,
                            timeout=RUN_TIMEOUT, env=demo_env(), cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    end = json.loads(result.stdout.splitlines()[-1])
    assert end["type"] == "end" and end["ok"] and end["step"] == steps, end
    return end


def trains_exactly_through_chaos(name: str, tmp_path: Path) -> None:
    """A 3-box chaos run with at least one kill ends with the 1-box fault-free run's digest."""
    steps = STEPS[name]
    chaotic = train(name, 3, steps, tmp_path / "chaos", chaos=True)
    if chaotic["recovered"] == 0:  # the run ended before a kill, or before the survivors' next step: train longer
        steps *= 3
        chaotic = train(name, 3, steps, tmp_path / "chaos-longer", chaos=True)
    assert chaotic["kills"] >= 1 and chaotic["recovered"] >= 1, chaotic
    alone = train(name, 1, steps, tmp_path / "alone")
    assert alone["kills"] == 0
    assert chaotic["digest"] == alone["digest"], (chaotic, alone)


def test_the_language_model_trains_exactly_through_chaos(tmp_path: Path) -> None:
    trains_exactly_through_chaos("lm", tmp_path)


def test_the_vision_model_trains_exactly_through_chaos(tmp_path: Path) -> None:
    trains_exactly_through_chaos("vision", tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed: pip install 'dpeer[examples]' to run the Hugging Face example")
def test_the_hugging_face_model_trains_exactly_through_chaos(tmp_path: Path) -> None:
    trains_exactly_through_chaos("hf", tmp_path)


# --- the DataLoader's worker processes -------------------------------------------------------


def processes() -> dict[int, tuple[int, str]]:
    """Every process this user can see: pid -> (parent pid, command line), read from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
    return found


def loader_workers(script: str) -> tuple[int, list[int]] | None:
    """The dpeer worker running ``script`` that has forked children (its DataLoader's workers), or None."""
    table = processes()
    for pid, (_, cmd) in table.items():
        if "dpeer.trainer.worker" in cmd and script in cmd:
            children = [c for c, (parent, _) in table.items() if parent == pid]
            if children:
                return pid, children
    return None


def test_the_data_loader_runs_worker_processes_beside_the_dpeer_worker(tmp_path: Path) -> None:
    """examples/lm asks for num_workers=2: while it trains, its dpeer worker has two children."""
    script = str(REPO / "examples" / "lm" / "train.py")
    proc = subprocess.Popen(demo_cmd("lm", 1, 100000, tmp_path / "cluster", chaos=False), env=demo_env(), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, seen = time.monotonic() + 60.0, None
        while seen is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            seen = loader_workers(script)
        assert seen is not None, "no dpeer worker with DataLoader worker processes appeared within 60 s"
        worker, children = seen
        assert len(children) >= 2, f"dpeer worker {worker} has children {children}; num_workers=2 makes two"
    finally:
        proc.send_signal(signal.SIGTERM)  # the demo stops every process it started
        proc.wait(timeout=60)
