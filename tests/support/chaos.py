"""Running `dpeer chaos` as a user would (a subprocess): its exit code, output and timeline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# One training config for both tests (same steps, batch and lr => one cached reference). Exact
# reduction (the default): the final model must equal the reference's bit for bit.
TRAINING = ["--steps", "2000", "--lr", "0.01"]


def run_chaos(tmp: Path, args: list[str], env: dict[str, str] | None = None, timeout: float = 540) -> tuple[int, str, dict[str, Any]]:
    """Run `dpeer chaos ARGS --out tmp/out --dir tmp/run`; (exit code, output, timeline)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DPEER_")}
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "dpeer.cli.main", "chaos", *args, *TRAINING,
           "--out", str(tmp / "out"), "--dir", str(tmp / "run")]
    log = tmp / "chaos.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=full_env)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the chaos tool then stops every daemon it started
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            pytest.fail(f"the chaos run took over {timeout:.0f}s:\n{log.read_text()[-4000:]}")
    output = log.read_text()
    timeline_path = tmp / "out" / "timeline.json"
    timeline = json.loads(timeline_path.read_text()) if timeline_path.exists() else {}
    return proc.returncode, output, timeline
