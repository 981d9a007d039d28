"""Two replicas that reach the same step with different parameters (two lineages) converge: the
heal picks one lineage (decisions.pick_lineage) and copies it to the other, where the digest check
used to fail at every re-form while the authority re-formed the same members for ever."""

from __future__ import annotations

import shutil

import pytest

from dpeer.trainer.audit import read_ledger
from dpeer.trainer.state import list_checkpoints

from tests.support.trainer_cluster import Cluster

OPTS = {"global_batch": 8, "micro_batch": 4, "dataset_len": 4096, "seed": 3, "hidden": 32}


def run(root: str, nodes: list[str], opts: dict, extra: list[str]) -> Cluster:
    cluster = Cluster(root, nodes, opts, extra)
    try:
        for n in nodes:
            cluster.start(n)
        cluster.run_authority()
        cluster.wait_exit(nodes, 120)
    finally:
        cluster.close()
    return cluster


@pytest.mark.timeout(300)
def test_two_lineages_at_one_step_converge_on_the_lowest_ranks(tmp_path) -> None:
    ckpt = str(tmp_path / "ckpt-{node}")
    every = ["--ckpt-dir", ckpt, "--ckpt-every", "20"]
    for node, lr in (("a", "0.05"), ("b", "0.02")):  # one lineage each, both at step 20
        run(str(tmp_path / f"fork-{node}"), [node], {**OPTS, "steps": 20, "lr": lr}, every)
    shutil.copytree(tmp_path / "ckpt-a", tmp_path / "ckpt-solo")
    both = run(str(tmp_path / "both"), ["a", "b"], {**OPTS, "steps": 40, "lr": "0.05"}, every)
    formed = [r for r in both.reports("b") if r["kind"] == "formed"]
    assert [r["step"] for r in formed][:1] == [20] and formed[0]["healed"], formed  # b took a's lineage
    assert not any(r["kind"] == "failure" for n in ("a", "b") for r in both.reports(n))
    assert [s for s, _ in list_checkpoints(str(tmp_path / "ckpt-b"))][:1] == [40]
    last = {n: read_ledger(both.ledger(n))[-1] for n in ("a", "b")}
    assert last["a"]["digest"] == last["b"]["digest"] != ""
    solo = run(str(tmp_path / "solo"), ["solo"], {**OPTS, "steps": 40, "lr": "0.05"}, every)
    assert read_ledger(solo.ledger("solo"))[-1]["digest"] == last["a"]["digest"]  # a's lineage, continued exactly
