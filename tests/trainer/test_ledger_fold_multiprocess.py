"""Real workers fold their ledgers as committed checkpoints cover their steps, one is killed after
its ledger was folded, comes back in a new generation, folds again; the ledgers, as they are on
disk, audit clean and the replicas end equal."""

from __future__ import annotations

import os
import threading

from dpeer.channel.local import publish_checkpoint
from dpeer.trainer.audit import audit, read_ledger, read_records
from dpeer.trainer.sampler import GlobalBatchSampler

from tests.support.trainer_cluster import Cluster

OPTS = {"steps": 1500, "global_batch": 8, "micro_batch": 4, "dataset_len": 4096, "seed": 5, "lr": 0.05, "hidden": 16}
NODES = ["a", "b"]


def committed_hints(cluster: Cluster, stop: threading.Event) -> None:
    """Play the daemon's part for checkpoints: the newest step every live node wrote a checkpoint of,
    with the same parameters, becomes the committed checkpoint the workers read."""
    published = 0
    while not stop.wait(0.05):
        held = []
        for n in NODES:
            held.append({(r["step"], r["params_digest"]) for r in cluster.reports(n) if r["kind"] == "checkpoint"})
        common = set.intersection(*held)
        newest = max(common, default=(0, ""))
        if newest[0] > published:
            publish_checkpoint(cluster.views, *newest)
            published = newest[0]


def ranges(path: str) -> list[dict]:
    return [r for r in read_records(path) if r.get("kind") == "range"]


def test_a_worker_killed_after_its_ledger_was_folded_leaves_ledgers_that_audit_clean(tmp_path) -> None:
    ckpt = os.path.join(str(tmp_path), "ckpt-{node}")
    cluster = Cluster(str(tmp_path), NODES, OPTS, ["--ckpt-dir", ckpt, "--ckpt-every", "10", "--timeout-floor", "1.5"])
    stop = threading.Event()
    hints = threading.Thread(target=committed_hints, args=(cluster, stop), daemon=True)
    try:
        for n in NODES:
            cluster.start(n)
        cluster.run_authority()
        hints.start()
        cluster.wait_for(lambda: ranges(cluster.ledger("b")), 180, "b's ledger folded")
        cluster.kill("b")  # SIGKILL
        killed_at = cluster.progress_step("a")
        cluster.start("b")
        cluster.wait_exit(NODES, 300)
    finally:
        stop.set()
        cluster.close()
    assert killed_at < OPTS["steps"] - 100, "the run ended before the restarted worker trained again"
    sampler = GlobalBatchSampler(OPTS["dataset_len"], OPTS["global_batch"], OPTS["seed"])
    ledgers = {n: read_records(cluster.ledger(n)) for n in NODES}
    assert not audit(ledgers, OPTS["steps"], sampler, OPTS["micro_batch"])
    assert len({r["gen"] for r in ranges(cluster.ledger("b"))}) >= 2  # folded before the kill and after it
    assert all(len(recs) < 200 for recs in ledgers.values())  # a folded head and a short tail, not 3000 records
    finals = {read_ledger(cluster.ledger(n))[-1]["digest"] for n in NODES}
    assert len(finals) == 1 and "" not in finals
