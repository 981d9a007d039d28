"""Bitwise-exact training on real worker processes, float32, exact reduction: a 3-box run with two
SIGKILLs, a SIGSTOP and two restarts ends with the same parameter-and-buffer digest (and the same
final state dict, bit for bit) as a fault-free 3-box run and a 1-box run of the same config; so do
a dropout model and a BatchNorm model through a kill and a restart."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from dpeer.trainer.audit import audit, read_ledger, read_records
from dpeer.trainer.sampler import GlobalBatchSampler

from tests.support.trainer_cluster import Cluster, progress_times

# Sized so that the job outlasts the faults on a loaded 2-core box: a restarted worker may need 20 s
# to import torch and build, and the survivors keep training meanwhile.
OPTS = {"steps": 3000, "global_batch": 16, "micro_batch": 4, "dataset_len": 4096, "seed": 11, "lr": 0.05,
        "hidden": 32}
NODES = ["a", "b", "c"]
EXTRA = ["--timeout-floor", "1.5"]  # a SIGSTOPped peer is given up after 1.5 s


def train(root: str, nodes: list[str], opts: dict, faults=None) -> Cluster:
    """Run `nodes` to the end of `opts` (applying `faults(cluster)` while they train); the cluster."""
    cluster = Cluster(root, nodes, opts, EXTRA)
    try:
        for n in nodes:
            cluster.start(n)
        cluster.run_authority()
        if faults is not None:
            faults(cluster)
        cluster.wait_exit(nodes, 240)
    finally:
        cluster.close()
    return cluster


def final_digest(cluster: Cluster, opts: dict) -> str:
    """The digest every node recorded at the last step (the audit checks the rest); exactly one."""
    sampler = GlobalBatchSampler(opts["dataset_len"], opts["global_batch"], opts["seed"])
    problems = audit({n: read_records(cluster.ledger(n)) for n in cluster.nodes}, opts["steps"], sampler,
                     opts["micro_batch"])
    assert not problems, problems
    last = {n: read_ledger(cluster.ledger(n))[-1] for n in cluster.nodes}
    assert {e["step"] for e in last.values()} == {opts["steps"] - 1}
    digests = {e["digest"] for e in last.values()}
    assert len(digests) == 1 and "" not in digests, last
    return digests.pop()


def assert_same_final_state(*clusters: Cluster) -> None:
    """Every node of every run saved the same final state dict, bit for bit."""
    states = [torch.load(c.final(n), weights_only=True) for c in clusters for n in c.nodes]
    for state in states[1:]:
        assert state.keys() == states[0].keys()
        for k in state:
            assert torch.equal(state[k].view(torch.uint8) if state[k].is_floating_point() else state[k],
                               states[0][k].view(torch.uint8) if state[k].is_floating_point() else states[0][k]), k


def _progressed(cluster: Cluster, nodes: list[str], after: float, world: int | None = None) -> bool:
    for n in nodes:
        formed = [r["t"] for r in cluster.reports(n) if r["kind"] == "formed" and r["t"] > after
                  and (world is None or r["world"] == world)]
        if not formed or not any(t > min(formed) for t, _ in progress_times(cluster.reports(n))):
            return False
    return True


def kill_and_restart(cluster: Cluster, victim: str, sig: int) -> None:
    """At a few steps past now, SIGKILL `victim` or SIGSTOP it; once the survivors trained without it,
    restart it (SIGKILL) or SIGCONT it (SIGSTOP); wait until it trained again with them. The restart
    waits for the survivors: a victim back before they re-formed as two (a loaded box) would join
    their next group, and they would never train without it."""
    others = [n for n in cluster.nodes if n != victim]
    at = cluster.progress_step(others[0]) + 20
    cluster.wait_for(lambda: cluster.progress_step(others[0]) >= at, 60, f"step {at}")
    t_fault = cluster.kill(victim, sig)
    cluster.wait_for(lambda: _progressed(cluster, others, t_fault, len(others)), 60, f"{others} training without {victim}")
    if sig == signal.SIGKILL:
        cluster.start(victim)
    else:
        cluster.mark_live(victim)
        os.kill(cluster.procs[victim].pid, signal.SIGCONT)
    back = time.time()
    cluster.wait_for(lambda: _progressed(cluster, [victim], t_fault, len(cluster.nodes)), 120,
                     f"{victim} training again (the job must outlast its restart: {cluster.progress_step(others[0])} "
                     f"of {cluster.job_opts['steps']} steps done {time.time() - back:.0f} s after the fault ended)")


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return train(str(tmp_path_factory.mktemp("solo")), ["solo"], OPTS)


@pytest.mark.timeout(600)
def test_kills_a_stop_and_restarts_end_bitwise_equal_to_fault_free_and_one_box_runs(solo: Cluster, tmp_path) -> None:
    def faults(cluster: Cluster) -> None:
        kill_and_restart(cluster, "c", signal.SIGKILL)
        kill_and_restart(cluster, "b", signal.SIGSTOP)
        kill_and_restart(cluster, "a", signal.SIGKILL)  # rank 0, the store's host

    chaos = train(str(tmp_path / "chaos"), NODES, OPTS, faults)
    clean = train(str(tmp_path / "clean"), NODES, OPTS)
    assert any(r["kind"] == "failure" for r in chaos.reports("b")), "the SIGSTOP did not make b's group fail"
    assert sum(1 for r in chaos.reports("a") + chaos.reports("c") if r["kind"] == "formed" and r["healed"]) >= 2
    assert final_digest(chaos, OPTS) == final_digest(clean, OPTS) == final_digest(solo, OPTS)
    assert_same_final_state(chaos, clean, solo)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", [{"dropout": "0.3"}, {"norm": "batch"}], ids=["dropout", "batchnorm"])
def test_a_dropout_and_a_batchnorm_model_end_bitwise_equal_through_a_kill(model: dict, tmp_path) -> None:
    opts = {**OPTS, "steps": 1500, **model}
    chaos = train(str(tmp_path / "chaos"), NODES, opts, lambda c: kill_and_restart(c, "b", signal.SIGKILL))
    one = train(str(tmp_path / "solo"), ["solo"], opts)
    assert final_digest(chaos, opts) == final_digest(one, opts)
    assert_same_final_state(chaos, one)
    if "norm" in model:
        state = torch.load(one.final("solo"), weights_only=True)
        assert int(state["1.num_batches_tracked"]) == opts["steps"]
        assert not torch.equal(state["1.running_mean"], torch.zeros_like(state["1.running_mean"]))


@pytest.mark.timeout(400)
def test_steps_of_at_most_one_micro_batch_a_rank_end_bitwise_equal_through_kills(tmp_path) -> None:
    """Two micro-batches a step: summed by the owners of the buckets' shards (exact_shards.py) on 3
    ranks (one without a micro-batch) and on 2, by the allreduce path on 1 box; kills of rank 0 and
    of another rank end with the 1-box run's bits."""
    opts = {**OPTS, "micro_batch": 8}

    def faults(cluster: Cluster) -> None:
        kill_and_restart(cluster, "c", signal.SIGKILL)
        kill_and_restart(cluster, "a", signal.SIGKILL)

    chaos = train(str(tmp_path / "chaos"), NODES, opts, faults)
    one = train(str(tmp_path / "solo"), ["solo"], opts)
    assert final_digest(chaos, opts) == final_digest(one, opts)
    assert_same_final_state(chaos, one)
