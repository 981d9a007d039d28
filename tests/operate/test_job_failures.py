"""A job that cannot train stops and says why; a fix and `dpeer job retry` let it train again.

Real daemons on loopback run jobs from tests/operate/jobs.py. The same exception at the same
step (or at build) coming back `training.failure_repeats` times halts the job: status `job`
says failed with the reason, within a bounded number of generations, and no more groups form.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from tests.operate.conftest import WAIT, Daemons, cli, wait_status

REPO = str(Path(__file__).resolve().parents[2])
ENV = {"PYTHONPATH": REPO}


def config(tmp_path: Path, job: str, **options: str) -> Path:
    path = tmp_path / "dpeer.yaml"
    path.write_text(yaml.safe_dump({"job": job, "training": {"steps": 60, "checkpoint_every": 0, "options": options}}))
    return path


def start_pair(daemons: Daemons, conf: Path) -> list[Any]:
    first = daemons.start("n1", config=conf, env=ENV)
    second = daemons.start("n2", join=[first.addr], config=conf, env=ENV)
    return [first, second]


def failed(doc: dict[str, Any]) -> bool:
    return (doc.get("job") or {}).get("state") == "failed"


def halting_lines(daemon: Any) -> list[dict[str, Any]]:
    return [line for line in daemon.log_lines() if "halting the job" in str(line.get("msg", line.get("message", "")))]


def test_a_job_that_raises_at_build_halts_with_its_reason_until_fixed_and_retried(daemons: Daemons,
                                                                                   tmp_path: Path) -> None:
    marker = tmp_path / "broken"
    marker.write_text("remove me to fix the job")
    nodes = start_pair(daemons, config(tmp_path, "tests.operate.jobs:fails_to_build", broken=str(marker)))
    doc = wait_status(nodes[0].addr, failed, "the job halted as failed", timeout=2 * WAIT)
    job = doc["job"]
    assert "ModuleNotFoundError: No module named 'missing_dependency'" in job["error"], job
    assert "building the job" in job["error"] and job["node"] in ("n1", "n2"), job
    assert doc["group"] is None, "no group formed for a job that never built"
    for node in nodes:
        wait_status(node.addr, failed, f"{node.node_id} reports the job failed")
    assert sum(len(halting_lines(n)) for n in nodes) == 1, "the leader says it once, as an error"
    # a retry before the fix fails again, the same way
    retry = cli("job", "retry", "--addr", nodes[1].addr)
    assert retry.returncode == 0, retry.stderr
    assert "ModuleNotFoundError" in retry.stdout
    wait_status(nodes[0].addr, lambda d: failed(d) and "3 times in a row" in d["job"]["error"],
                "the unfixed job failed again, after three more builds", timeout=2 * WAIT)
    marker.unlink()
    retry = cli("job", "retry", "--addr", nodes[0].addr)
    assert retry.returncode == 0, retry.stderr
    trained = wait_status(nodes[0].addr, lambda d: (d.get("train") or {}).get("step", 0) >= 10,
                          "the fixed job trains after the retry", timeout=2 * WAIT)
    assert trained["job"]["state"] in ("training", "finished"), trained["job"]
    again = cli("job", "retry", "--addr", nodes[0].addr)
    assert again.returncode == 1 and "not failed" in again.stderr, again


def test_a_job_that_raises_at_step_3_halts_within_a_bounded_number_of_generations(daemons: Daemons,
                                                                                  tmp_path: Path) -> None:
    nodes = start_pair(daemons, config(tmp_path, "tests.operate.jobs:fails_at_step"))
    doc = wait_status(nodes[1].addr, failed, "the job halted as failed", timeout=2 * WAIT)
    job = doc["job"]
    assert "ValueError: boom: the loss has no value for step 3" in job["error"], job
    assert job["step"] == 3 and "at step 3" in job["error"] and "3 times in a row" in job["error"], job
    generation = doc["group"]["generation"] if doc["group"] else 0
    assert generation <= 6, f"{generation} generations before the halt"
    assert max((d.get("train") or {}).get("step", 0) for d in [doc]) <= 3
    # halted for good: no new generation while nobody retries
    settled = wait_status(nodes[0].addr, failed, "n1 reports the halt")
    assert (settled["group"] or {}).get("generation", 0) <= generation + 1


def test_dpeer_job_retry_without_any_job_is_refused_with_exit_1(daemons: Daemons, tmp_path: Path) -> None:
    """Outside tester's finding: it said "the job is running" of a cluster that runs no job."""
    node = daemons.start("n1", env=ENV)
    wait_status(node.addr, lambda d: d["leader"] == "n1", "n1 leads")
    result = cli("job", "retry", "--addr", node.addr)
    assert result.returncode == 1 and "there is no job to retry" in result.stderr, result
    assert json.loads(cli("status", "--addr", node.addr, "--json").stdout)["job"] is None
    assert not os.path.exists(node.data_dir / "worker")
