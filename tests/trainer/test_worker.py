"""The worker entry: usage errors, and resuming from its own atomic checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dpeer.channel.local import publish_checkpoint, read_reports
from dpeer.trainer.state import list_checkpoints

from dpeer.trainer.audit import read_ledger, read_records, step_digests

from tests.support.trainer_cluster import REPO, Cluster

OPTS = {"global_batch": 8, "micro_batch": 4, "dataset_len": 4096, "seed": 3}


def test_bad_usage_exits_2():
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("DPEER_NODE_ID", None)
    env.pop("DPEER_VIEWS", None)
    r = subprocess.run([sys.executable, "-m", "dpeer.trainer.worker"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "--node-id" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "dpeer.trainer.worker", "--node-id", "a", "--views", "dir:/tmp/x", "--job", "nocolon"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert r.returncode == 2 and "MODULE:FUNCTION" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "dpeer.trainer.worker", "--node-id", "a", "--views", "dir:/tmp/x", "--digest-every", "0"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert r.returncode == 2 and "--digest-every" in r.stderr


def test_a_job_exact_reduction_cannot_run_is_a_build_failure_with_the_reason(tmp_path):
    """Exit 3 and a job_error report, which the daemon passes on so the leader halts the job."""
    env = {**os.environ, "PYTHONPATH": REPO}
    r = subprocess.run(
        [sys.executable, "-m", "dpeer.trainer.worker", "--node-id", "a", "--views", f"dir:{tmp_path}",
         "--job-opt", "global_batch=8", "--job-opt", "micro_batch=3"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert r.returncode == 3, r.stderr
    assert "global_batch (8) to be a multiple of micro_batch (3)" in r.stderr and "Traceback" not in r.stderr
    errors = [x for x in read_reports(str(tmp_path), "a") if x["kind"] == "job_error"]
    assert len(errors) == 1 and "multiple of micro_batch" in errors[0]["error"], errors


def _run_single(root: str, steps: int, extra: list[str], checkpoint: tuple[int, str] = (0, ""),
                hint: tuple[int, str] | None = None) -> Cluster:
    cluster = Cluster(root, ["a"], {**OPTS, "steps": steps}, extra)
    cluster.checkpoint = checkpoint
    if hint is not None:
        publish_checkpoint(cluster.views, *hint)
    try:
        cluster.start("a")
        cluster.run_authority()
        cluster.wait_exit(["a"], 60)
    finally:
        cluster.close()
    return cluster


def test_restart_resumes_from_checkpoint_bitwise(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    first = _run_single(str(tmp_path / "one"), 30, ["--ckpt-dir", ckpt, "--ckpt-every", "10"])
    assert [s for s, _ in list_checkpoints(ckpt)] == [30, 20]
    resumed = _run_single(str(tmp_path / "two"), 40, ["--ckpt-dir", ckpt, "--ckpt-every", "10"])
    straight = _run_single(str(tmp_path / "three"), 40, [])
    steps = [e["step"] for e in read_ledger(first.ledger("a"))] + [e["step"] for e in read_ledger(resumed.ledger("a"))]
    assert steps == list(range(40))
    assert read_ledger(resumed.ledger("a"))[-1]["digest"] == read_ledger(straight.ledger("a"))[-1]["digest"]


def _reported(cluster: Cluster, kind: str) -> list[dict]:
    return [r for r in cluster.reports("a") if r["kind"] == kind]


@pytest.mark.parametrize("told_by", ["view", "daemon's record"])
def test_resume_takes_the_committed_checkpoint_not_a_newer_unrecorded_one(tmp_path, told_by):
    ckpt = str(tmp_path / "ckpt")
    first = _run_single(str(tmp_path / "one"), 30, ["--ckpt-dir", ckpt, "--ckpt-every", "10"])
    written = {r["step"]: r["params_digest"] for r in _reported(first, "checkpoint")}
    assert sorted(written) == [10, 20, 30] and len(set(written.values())) == 3
    committed = (20, written[20])
    resumed = _run_single(str(tmp_path / "two"), 40, ["--ckpt-dir", ckpt, "--ckpt-every", "0"],
                          *((committed, None) if told_by == "view" else ((0, ""), committed)))
    loaded = _reported(resumed, "checkpoint_loaded")
    assert [r["step"] for r in loaded] == [20] and "ignoring 1 newer" in loaded[0]["reason"]
    if told_by != "view":  # loaded before the worker said it was ready, so peers never wait on it
        kinds = [r["kind"] for r in resumed.reports("a")]
        assert kinds.index("checkpoint_loaded") < kinds.index("waiting")
    assert [e["step"] for e in read_ledger(resumed.ledger("a"))] == list(range(20, 40))
    straight = _run_single(str(tmp_path / "three"), 40, [])
    assert read_ledger(resumed.ledger("a"))[-1]["digest"] == read_ledger(straight.ledger("a"))[-1]["digest"]


def test_a_checkpoint_whose_parameters_differ_from_the_committed_digest_is_refused(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    _run_single(str(tmp_path / "one"), 20, ["--ckpt-dir", ckpt, "--ckpt-every", "10"])
    resumed = _run_single(str(tmp_path / "two"), 25, ["--ckpt-dir", ckpt, "--ckpt-every", "0"], (20, "f" * 64))
    rejected = _reported(resumed, "checkpoint_rejected")
    assert len(rejected) == 1 and "differ from the committed digest" in rejected[0]["reason"]
    assert [r["step"] for r in _reported(resumed, "checkpoint_loaded")] == [10]
    assert [e["step"] for e in read_ledger(resumed.ledger("a"))] == list(range(10, 25))


def test_digests_every_n_steps_are_the_digests_of_those_steps(tmp_path):
    sparse = step_digests(read_records(_run_single(str(tmp_path / "sparse"), 17, ["--digest-every", "5"]).ledger("a")))
    every = step_digests(read_records(_run_single(str(tmp_path / "every"), 17, ["--digest-every", "1"]).ledger("a")))
    digested = [0, 4, 9, 14, 16]  # the group's first step, steps 5, 10, 15 done, and the last
    assert sorted(sparse) == digested and sorted(every) == list(range(17))
    assert [sparse[s] for s in digested] == [every[s] for s in digested]
