"""Real worker processes on 127.0.0.1 driven by a fake view authority: failure-free training (fast
reduction: the replicas still agree with each other), SIGKILL + restart with healing, SIGSTOP past
the collective timeout (exact reduction, the default)."""

from __future__ import annotations

import json
import os
import signal
import statistics
import time

import pytest
import torch

from dpeer.trainer.sampler import GlobalBatchSampler

from dpeer.trainer.audit import audit, read_ledger, read_records

from tests.support.trainer_cluster import Cluster, progress_times

# float64: the equivalence check compares against a world-1 run, and in float32 the rounding
# differences of other world sizes grow chaotically past 1e-4 over thousands of steps.
OPTS = {"steps": 2500, "global_batch": 16, "micro_batch": 4, "dataset_len": 40960, "seed": 7, "lr": 0.02,
        "dtype": "float64"}
NODES = ["a", "b", "c"]
FIGURES = os.environ.get("DPEER_FIGURES")


def _figure(name: str, value) -> None:
    print(f"FIGURE {name} = {value}")
    if FIGURES:
        with open(FIGURES, "a") as f:
            f.write(json.dumps({name: value}) + "\n")


def check_ledgers(cluster: Cluster, opts: dict, exact: bool = True) -> None:
    """Exactly-once and consistency checks over every node's ledger (dpeer.trainer.audit)."""
    sampler = GlobalBatchSampler(opts["dataset_len"], opts["global_batch"], opts["seed"])
    ledgers = {node: read_records(cluster.ledger(node)) for node in cluster.nodes}
    problems = audit(ledgers, opts["steps"], sampler, opts["micro_batch"] if exact else None)
    assert not problems, problems


def final_params(cluster: Cluster, node: str) -> dict[str, torch.Tensor]:
    return torch.load(cluster.final(node), weights_only=True)


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in a)


def _median_step_time(reports) -> float:
    t = [ts for ts, _ in progress_times(reports)]
    gaps = sorted(b - a for a, b in zip(t, t[1:]))
    return statistics.median(gaps)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A failure-free single-worker run of OPTS: the equivalence reference for the chaos runs."""
    cluster = Cluster(str(tmp_path_factory.mktemp("ref")), ["solo"], OPTS)
    try:
        cluster.start("solo")
        cluster.run_authority()
        cluster.wait_exit(["solo"], 120)
    finally:
        cluster.close()
    return cluster


@pytest.mark.timeout(120)
def test_three_workers_train_to_the_same_digest(tmp_path):
    opts = {**OPTS, "steps": 300}
    cluster = Cluster(str(tmp_path), NODES, opts, ["--reduction", "fast"])
    try:
        for n in NODES:
            cluster.start(n)
        cluster.run_authority()
        cluster.wait_exit(NODES, 90)
    finally:
        cluster.close()
    check_ledgers(cluster, opts, exact=False)
    finals = [read_ledger(cluster.ledger(n))[-1] for n in NODES]
    assert {f["step"] for f in finals} == {opts["steps"] - 1}
    assert len({f["digest"] for f in finals}) == 1
    params = [final_params(cluster, n) for n in NODES]
    assert max_rel_diff(params[1], params[0]) == 0.0
    _figure("steady_step_ms_world3", round(1e3 * _median_step_time(cluster.reports("a")), 2))


def _formed_after(cluster: Cluster, node: str, t0: float, world: int) -> float:
    times = [r["t"] for r in cluster.reports(node) if r["kind"] == "formed" and r["t"] > t0 and r["world"] == world]
    return min(times) if times else 0.0


def _first_progress_after(cluster: Cluster, nodes: list[str], t0: float) -> float:
    times = [t for n in nodes for t, _ in progress_times(cluster.reports(n)) if t > t0]
    return min(times) if times else 0.0


def _kill_and_restart(cluster: Cluster, victim: str, at_step: int) -> tuple[float, float]:
    survivors = [n for n in NODES if n != victim]
    cluster.wait_for(lambda: cluster.progress_step(survivors[0]) >= at_step, 60, f"step {at_step}")
    t_kill = cluster.kill(victim)
    t_formed = cluster.wait_for(lambda: _formed_after(cluster, survivors[0], t_kill, 2), 30, "re-form of survivors")
    t_next = cluster.wait_for(lambda: _first_progress_after(cluster, survivors, t_formed), 30, "survivors' next step")
    t_start = cluster.start(victim)
    t_first = cluster.wait_for(lambda: _first_progress_after(cluster, [victim], t_start), 45, "restarted worker's step")
    healed = [r for r in cluster.reports(victim) if r["kind"] == "formed" and r["t"] > t_start]
    assert any(r["healed"] and r["world"] == 3 for r in healed)
    t_ready = min(r["t"] for r in cluster.reports(victim) if r["kind"] == "waiting" and r["t"] > t_start)
    _figure("restart_spawn_to_ready_s", round(t_ready - t_start, 3))
    _figure("restart_ready_to_first_step_s", round(t_first - t_ready, 3))
    return t_next - t_kill, t_first - t_start


@pytest.mark.timeout(150)
def test_kill_restart_heals_and_matches_failure_free_run(reference, tmp_path):
    cluster = Cluster(str(tmp_path), NODES, OPTS)
    try:
        for n in NODES:
            cluster.start(n)
        cluster.run_authority()
        kill_to_step, restart_to_step = _kill_and_restart(cluster, "c", 60)
        cluster.wait_exit(NODES, 90)
    finally:
        cluster.close()
    check_ledgers(cluster, OPTS)
    finals = {read_ledger(cluster.ledger(n))[-1]["digest"] for n in NODES}
    assert len(finals) == 1
    rel = max_rel_diff(final_params(cluster, "a"), final_params(reference, "solo"))
    assert rel < 1e-4, f"chaos run drifted from the failure-free run by {rel}"
    _figure("kill_to_next_step_s", round(kill_to_step, 3))
    _figure("restart_to_first_step_s", round(restart_to_step, 3))
    _figure("equivalence_max_rel", rel)
    _figure("steady_step_ms_world1", round(1e3 * _median_step_time(reference.reports("solo")), 2))


@pytest.mark.timeout(150)
def test_sigstop_past_timeout_reforms_then_rejoins(tmp_path):
    opts = {**OPTS, "steps": 600}
    cluster = Cluster(str(tmp_path), NODES, opts, ["--timeout-floor", "1.5"])
    try:
        for n in NODES:
            cluster.start(n)
        cluster.run_authority()
        cluster.wait_for(lambda: cluster.progress_step("a") >= 50, 60, "step 50")
        t_stop = cluster.kill("b", signal.SIGSTOP)
        t_formed = cluster.wait_for(lambda: _formed_after(cluster, "a", t_stop, 2), 40, "re-form of survivors")
        t_next = cluster.wait_for(lambda: _first_progress_after(cluster, ["a", "c"], t_formed), 40, "survivors' step")
        cluster.mark_live("b")
        t_cont = time.time()
        os.kill(cluster.procs["b"].pid, signal.SIGCONT)
        cluster.wait_for(lambda: _first_progress_after(cluster, ["b"], t_cont), 40, "resumed worker's step")
        cluster.wait_exit(NODES, 90)
    finally:
        cluster.close()
    check_ledgers(cluster, opts)
    assert any(r["kind"] == "failure" for r in cluster.reports("b"))
    assert len({read_ledger(cluster.ledger(n))[-1]["digest"] for n in NODES}) == 1
    _figure("sigstop_to_next_step_s", round(t_next - t_stop, 3))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_repeated_kills_median(tmp_path):
    opts = {**OPTS, "steps": 4500, "dataset_len": 73728}
    cluster = Cluster(str(tmp_path), NODES, opts)
    kills, restarts = [], []
    try:
        for n in NODES:
            cluster.start(n)
        cluster.run_authority()
        for victim in ["c", "a", "b"]:
            start_step = cluster.progress_step("a") + 20
            k, r = _kill_and_restart(cluster, victim, start_step)
            kills.append(k)
            restarts.append(r)
        cluster.wait_exit(NODES, 120)
    finally:
        cluster.close()
    check_ledgers(cluster, opts)
    _figure("kill_to_next_step_trials_s", [round(k, 3) for k in kills])
    _figure("kill_to_next_step_median_s", round(statistics.median(kills), 3))
    _figure("restart_to_first_step_median_s", round(statistics.median(restarts), 3))
