"""A full-cluster power loss: every box is SIGKILLed at once and restarted on its data dir.

The cluster must resume from the newest checkpoint that the log recorded (a majority of the group
reported holding it with one parameter digest), not from whatever a single box wrote last, and
still train the model a run without failures trains.
"""

from __future__ import annotations

import signal
import time

from dpeer.channel.local import read_reports
from tests.support.daemons import run
from tests.support.training import TIMEOUT, assert_exact, assert_matches_clean_run, finished, training

STEPS, BATCH, EVERY = 500, 16, 50
CONFIG = {"training": {"steps": STEPS, "global_batch": BATCH, "micro_batch": 8, "checkpoint_every": EVERY,
                       "options": {"dtype": "float64"}}}


def committed_checkpoint(docs: dict) -> int:
    """The newest committed checkpoint step any node reports (0 for none)."""
    return max(((d or {}).get("checkpoint") or {}).get("step", 0) for d in docs.values())


def held_by_several(docs: dict) -> bool:
    """The newest committed checkpoint is at step 2 x EVERY or later and has two holders or more
    (one recorded while the first worker ready trained alone has one)."""
    newest = max(((d or {}).get("checkpoint") or {} for d in docs.values()), key=lambda c: c.get("step", 0))
    return newest.get("step", 0) >= 2 * EVERY and len(newest.get("holders", [])) >= 2


def test_full_power_loss_resumes_from_the_committed_checkpoint(make_cluster) -> None:
    cluster = make_cluster(3, job="demo", config=CONFIG)
    cluster.start_all()
    nodes = ["n1", "n2", "n3"]

    async def until_recorded() -> dict:
        await training(cluster, nodes, 3, past=0)
        return await cluster.wait_for(held_by_several, TIMEOUT,
                                      f"a committed checkpoint at step {2 * EVERY} or later with two holders")

    run(until_recorded())
    for node in cluster.nodes:
        cluster.kill(node, signal.SIGKILL)
    restarted_at = time.time()
    for node in cluster.nodes:
        cluster.start(node)

    async def after_restart() -> dict:
        return await cluster.wait_for(lambda d: len(d) == 3 and all(d.values()), TIMEOUT, "every node answering")

    docs = run(after_restart())
    recorded = committed_checkpoint(docs)
    holders = next(d["checkpoint"]["holders"] for d in docs.values() if (d["checkpoint"] or {}).get("step") == recorded)
    assert recorded >= 2 * EVERY and len(holders) >= 2
    run(finished(cluster))

    first_groups = []
    for node in cluster.nodes:
        reports = [r for r in read_reports(str(node.data_dir / "worker"), node.node_id) if r["t"] >= restarted_at]
        formed = [r for r in reports if r["kind"] == "formed"]
        assert formed and formed[0]["step"] >= recorded, f"{node.node_id}'s first group was at {formed[:1]}"
        first_groups.append(formed[0])
        if node.node_id in holders:
            loaded = [r["step"] for r in reports if r["kind"] == "checkpoint_loaded" and r["t"] <= formed[0]["t"]]
            assert loaded and loaded[-1] == recorded, f"{node.node_id} held step {recorded} but loaded {loaded}"
    earliest = min(first_groups, key=lambda r: r["t"])
    assert earliest["step"] == recorded, f"the first group after the power loss resumed at {earliest}"
    final = assert_exact(cluster, STEPS, nodes)
    assert_matches_clean_run(cluster, {"training": {**CONFIG["training"], "checkpoint_every": 0}}, final)
