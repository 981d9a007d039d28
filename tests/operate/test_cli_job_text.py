"""The job in `dpeer status` text as an operator reads it on real daemons: a halted job's reason,
the newest committed step (not the newest digested one) and one line per member; `dpeer start
--job-opt` reaching the job; `dpeer demo --json` ending with the run's final step and digest."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.daemons import WAIT, Daemons, cli, wait_status

REPO = str(Path(__file__).resolve().parents[2])
ENV = {"PYTHONPATH": REPO}


def test_a_halted_job_shows_in_the_text_status_with_what_to_do(daemons: Daemons, tmp_path: Path) -> None:
    """The option reaches the job only through --job-opt: its build names the marker file it found."""
    marker = tmp_path / "broken-marker"
    marker.touch()
    conf = tmp_path / "dpeer.yaml"
    conf.write_text(yaml.safe_dump({"training": {"steps": 50, "failure_repeats": 2, "checkpoint_every": 0}}))
    n1 = daemons.start("n1", config=conf, env=ENV,
                       extra=["--job", "tests.operate.jobs:fails_to_build", "--job-opt", f"broken={marker}"])
    doc = wait_status(n1.addr, lambda d: (d.get("job") or {}).get("state") == "failed", "the job halted",
                      timeout=3 * WAIT)
    assert "(marker broken-marker)" in doc["job"]["error"], doc["job"]
    text = cli("status", "--addr", n1.addr)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert f"job failed: {doc['job']['error']}" in lines, text.stdout
    assert "what to do: fix the cause on every box, then `dpeer job retry`" in lines, text.stdout
    assert any(re.fullmatch(rf"n1\s+{re.escape(n1.addr)}\s+alive\s+leader\s+-\s+-\s+\d+\s+\d+\s+-\s+-\s+-", line)
               for line in lines), text.stdout


def test_the_text_status_shows_the_newest_committed_step_and_each_member(daemons: Daemons, tmp_path: Path) -> None:
    """Digests only every 100000 steps: the newest digested step stays the group's first while
    the committed step moves on, and the text shows the committed one."""
    conf = tmp_path / "dpeer.yaml"
    conf.write_text(yaml.safe_dump({"job": "demo", "training": {"steps": 100000, "digest_every": 100000,
                                                                "checkpoint_every": 0}}))
    n1 = daemons.start("n1", config=conf)
    before = wait_status(n1.addr, lambda d: (d.get("train") or {}).get("latest_step", 0) >= 5,
                         "five steps committed", timeout=3 * WAIT)
    digested = before["train"]["step"]
    assert digested < before["train"]["latest_step"], before["train"]
    status, members = cli("status", "--addr", n1.addr), cli("members", "--addr", n1.addr)
    assert status.returncode == members.returncode == 0, (status.stderr, members.stderr)
    step = int(re.search(r"^job training  step (\d+)$", status.stdout, re.M).group(1))  # type: ignore[union-attr]
    assert step >= before["train"]["latest_step"] > digested, (step, before["train"])
    assert f"digest at step {digested}  samples" in status.stdout, status.stdout
    row = members.stdout.splitlines()[1].split()
    assert row[:5] == ["n1", n1.addr, "alive", "leader", "0"] and int(row[5]) >= step, members.stdout


def test_demo_json_prints_one_object_a_line_ending_with_the_final_step_and_digest(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPEER_")}
    result = subprocess.run([sys.executable, "-m", "dpeer.cli.main", "demo", "--nodes", "1", "--steps", "20", "--json",
                             "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records[0] == {"type": "start", "nodes": 1, "steps": 20, "dir": str(tmp_path), "chaos": False, "seed": 1,
                          "job": "demo"}
    assert {r["type"] for r in records[1:-1]} <= {"event", "progress"}
    assert any(r["type"] == "event" and r["text"].startswith("the job finished at step 20") for r in records)
    end = records[-1]
    assert end["type"] == "end" and end["exit_code"] == 0 and end["ok"] is True and end["step"] == 20, end
    assert re.fullmatch(r"[0-9a-f]{64}", end["digest"]) and end["digest"][:12] in end["verdict"], end
    assert result.stderr == ""
