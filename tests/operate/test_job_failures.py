"""A job that cannot train stops and says why; a fix and `dpeer job retry` let it train again.

Real daemons on loopback run jobs from tests/operate/jobs.py. The same exception at the same
step coming back `training.failure_repeats` times halts the job (its figures folded: a message
whose PID or free-memory figure changes on each try is the same exception): status `job` says
failed with the reason, within a bounded number of generations, and no more groups form. A box
whose build keeps failing is kept out and says so; it halts the job only when no box can train.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from tests.support.daemons import WAIT, Daemons, cli, wait_status

REPO = str(Path(__file__).resolve().parents[2])
ENV = {"PYTHONPATH": REPO}


def config(tmp_path: Path, job: str, name: str = "dpeer", steps: int = 60, repeats: int = 3, **options: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"job": job, "training": {"steps": steps, "checkpoint_every": 0,
                                                             "failure_repeats": repeats, "options": options}}))
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
    # a short job may already be past its last step here, waiting for its final model
    assert trained["job"]["state"] in ("training", "finished") or trained["job"].get("finishing"), trained["job"]
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


def lines_at(daemon: Any, text: str, levels: tuple[str, ...]) -> list[dict[str, Any]]:
    return [line for line in daemon.log_lines() if text in str(line.get("msg", "")) and line.get("level") in levels]


def test_a_job_failing_every_step_with_a_changing_message_halts_and_warns(daemons: Daemons, tmp_path: Path) -> None:
    """An outside tester's finding: the loss raises the same MemoryError at every step, its "MiB free"
    differing on each try; compared as is, no two failures matched and the job re-formed for ever,
    status saying `job: {state: training, error: null}` and the log saying it at info level."""
    node = daemons.start("n1", config=config(tmp_path, "tests.operate.jobs:fails_every_step_with_a_changing_message"),
                         env=ENV)
    doc = wait_status(node.addr, failed, "the job halted as failed", timeout=2 * WAIT)
    job = doc["job"]
    assert "MemoryError: tried to allocate 2.00 GiB" in job["error"] and "3 times in a row" in job["error"], job
    assert (doc["group"] or {}).get("generation", 0) <= 6, doc["group"]
    warned = lines_at(node, "the job failed at step 0", ("warning",))
    assert len(warned) >= 2 and "MiB free" in warned[0]["msg"], [line["msg"] for line in warned]
    quiet = [line["msg"] for line in lines_at(node, "MiB free", ("info", "debug"))
             if not line["msg"].startswith("committed")]
    assert not quiet, f"the job's own error logged below warning: {quiet}"


def test_a_job_that_keeps_failing_without_halting_says_so_in_its_status(daemons: Daemons, tmp_path: Path) -> None:
    conf = config(tmp_path, "tests.operate.jobs:fails_every_step_with_a_changing_message", repeats=50)
    node = daemons.start("n1", config=conf, env=ENV)

    def failing(doc: dict[str, Any]) -> bool:
        last = (doc.get("job") or {}).get("last_failure") or {}
        return last.get("repeats", 0) >= 3

    doc = wait_status(node.addr, failing, "the status counts the repeated failure", timeout=2 * WAIT)
    job = doc["job"]
    assert job["state"] in ("training", "waiting") and job["error"] is None, job
    last = job["last_failure"]
    assert last["phase"] == "train" and last["step"] == 0 and "MiB free" in last["error"], last


def test_a_build_failing_with_a_changing_pid_halts_a_lone_box(daemons: Daemons, tmp_path: Path) -> None:
    node = daemons.start("n1", config=config(tmp_path, "tests.operate.jobs:fails_to_build_with_a_changing_message"),
                         env=ENV)
    doc = wait_status(node.addr, failed, "the job halted as failed", timeout=2 * WAIT)
    job = doc["job"]
    assert "lock held (pid" in job["error"] and "building the job on n1" in job["error"], job
    assert "3 times in a row" in job["error"] and "no box can build it: n1" in job["error"], job


def test_one_box_that_cannot_build_is_kept_out_and_the_group_trains_without_it(daemons: Daemons,
                                                                               tmp_path: Path) -> None:
    """An outside tester's finding: n1 trains alone; n2 joins with a box that cannot build the job (a
    package missing there only); its three failed builds halted the job for the whole cluster."""
    marker = tmp_path / "broken-on-n2"
    marker.touch()
    job = "tests.operate.jobs:fails_to_build"
    confs = {n: config(tmp_path, job, name=n, steps=100000, broken=str(b))
             for n, b in (("n1", tmp_path / "absent"), ("n2", marker))}
    n1 = daemons.start("n1", config=confs["n1"], env=ENV)
    trained = wait_status(n1.addr, lambda d: (d.get("train") or {}).get("step", 0) >= 10, "n1 training alone",
                          timeout=2 * WAIT)
    n2 = daemons.start("n2", join=[n1.addr], config=confs["n2"], env=ENV)

    def kept_out(doc: dict[str, Any]) -> bool:
        return "n2" in ((doc.get("job") or {}).get("kept_out") or {})

    doc = wait_status(n1.addr, kept_out, "the leader keeps n2 out", timeout=3 * WAIT)
    assert "No module named 'missing_dependency'" in doc["job"]["kept_out"]["n2"], doc["job"]
    assert len(lines_at(n2, "could not be built", ("error",))) >= 3
    assert lines_at(n1, "n2 is kept out of the group; n1 can train without it", ("warning",))
    mine = wait_status(n2.addr, lambda d: ((d.get("job") or {}).get("last_failure") or {}).get("repeats", 0) >= 3,
                       "n2 says why it does not train")
    assert mine["job"]["state"] == "waiting" and mine["job"]["last_failure"]["phase"] == "build", mine["job"]
    later = wait_status(n1.addr, lambda d: (d.get("train") or {}).get("step", 0) > trained["train"]["step"] + 10,
                        "n1 training on")
    assert later["job"]["state"] == "training", later["job"]
    assert later["group"]["members"] == ["n1"], later["group"]
    assert not halting_lines(n1) and not halting_lines(n2)
