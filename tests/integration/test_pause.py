"""`dpeer job pause` and `dpeer job resume` through real daemons training the demo job.

A pause is committed, then the leader ends the group with an empty view: every worker stops at
the same step, keeps its process and its state, and no group forms while paused. A worker that
crashes while paused is replaced by one that is told of the pause too (views are otherwise handed
only as they commit). A resume forms the group again from that step, the new worker healed from
its peer; the run audits clean (no sample skipped or repeated) and ends on the model of a run that
never paused.
"""

from __future__ import annotations

import asyncio
import os
import signal

from tests.support.daemons import cli, run
from tests.support.training import (
    BATCH, MICRO_BATCH, TIMEOUT, assert_exact, assert_matches_clean_run, finished, steps_of, training,
)

STEPS = 400
CONFIG = {"training": {"steps": STEPS, "global_batch": BATCH, "micro_batch": MICRO_BATCH, "checkpoint_every": 0,
                       "options": {"dtype": "float64"}}}
HELD_FOR = 2.0  # how long the paused cluster is watched for a step or a group that should not come


def paused(doc: dict | None) -> bool:
    """Paused, in no group, and the worker holds at the step its status shows."""
    return (bool(doc) and doc["control"] == "paused" and doc["group"] is None
            and doc["worker"]["paused_at"] == (doc.get("train") or {}).get("step"))


def test_a_paused_cluster_holds_its_step_and_resumes_to_the_clean_run_model(make_cluster) -> None:
    cluster = make_cluster(2, job="demo", config=CONFIG)
    cluster.start_all()
    nodes = ["n1", "n2"]
    addr = cluster.node("n2").addr

    async def scenario() -> dict:
        await training(cluster, nodes, 2, past=10)
        pause = cli("job", "pause", "--addr", addr, "--json")
        assert pause.returncode == 0 and '"paused": true' in pause.stdout, pause
        docs = await cluster.wait_for(lambda d: all(paused(d[n]) for n in nodes), TIMEOUT, "both boxes paused")
        held = steps_of(docs, nodes)
        pids = {n: docs[n]["worker"]["pid"] for n in nodes}
        again = cli("job", "pause", "--addr", addr)
        assert again.returncode == 1 and "already paused" in again.stderr, again
        await asyncio.sleep(HELD_FOR)  # an observation window, not a synchronisation: nothing may move in it
        docs = await cluster.statuses()
        assert all(paused(docs[n]) for n in nodes), docs
        assert steps_of(docs, nodes) == held and len(set(held.values())) == 1, (held, steps_of(docs, nodes))
        assert {n: docs[n]["worker"]["pid"] for n in nodes} == pids, "a pause keeps the worker processes"
        os.kill(pids["n2"], signal.SIGKILL)  # a worker our daemon started, by its pid

        def replaced(d: dict) -> bool:
            worker = (d["n2"] or {}).get("worker") or {}
            return worker.get("pid") not in (None, pids["n2"]) and worker.get("paused_at") is not None
        docs = await cluster.wait_for(replaced, TIMEOUT, "n2's new worker told of the pause")
        assert docs["n2"]["group"] is None and paused(docs["n1"]), docs
        resume = cli("job", "resume", "--addr", cluster.node("n1").addr)
        assert resume.returncode == 0, resume
        await training(cluster, nodes, 2, past=held["n1"])
        again = cli("job", "resume", "--addr", addr)
        assert again.returncode == 1 and "already running" in again.stderr, again
        await finished(cluster)
        return held

    held = run(scenario())
    logs = "\n".join(cluster.tail(cluster.node(n), 400) for n in nodes)
    assert logs.count(f"worker stopped at step {held['n1']} ") == 2, logs
    assert_matches_clean_run(cluster, CONFIG, assert_exact(cluster, STEPS, nodes))
