"""A finished job is finished for everyone: a box killed before the end and restarted
after it takes the final state from a peer instead of training alone, and ends with the digest
the others committed."""

from __future__ import annotations

import signal

import torch

from tests.support.daemons import Daemons, run

STEPS = 600
KILL_AT = 60  # far enough from the end that the kill lands before it: a demo step takes a few ms
CONFIG = {"training": {"steps": STEPS, "global_batch": 16, "micro_batch": 8, "checkpoint_every": 0}}
TIMEOUT = 180.0


def job(doc: dict | None) -> dict:
    return (doc or {}).get("job") or {}


async def returns_after_the_end(cluster: Daemons) -> dict:
    late = cluster.node("n3")
    await cluster.wait_for(lambda d: all(((d.get(n) or {}).get("train") or {}).get("step", 0) >= KILL_AT
                                         for n in ("n1", "n2", "n3")), TIMEOUT, "training under way")
    cluster.kill(late, signal.SIGKILL)
    ended = await cluster.wait_for(lambda d: all(job(d.get(n)).get("state") == "finished" for n in ("n1", "n2")),
                                   TIMEOUT, "the job finished on n1 and n2")
    final = job(ended["n1"])
    cluster.start(late)

    def back(docs: dict) -> bool:
        doc = docs.get("n3") or {}
        train = doc.get("train") or {}
        return (job(doc).get("state") == "finished" and (doc.get("worker") or {}).get("done")
                and train.get("step") == final["step"] and train.get("params_digest") == final["digest"])
    await cluster.wait_for(back, TIMEOUT, "n3 back with the final state")
    return final


def test_a_box_back_after_the_end_takes_the_final_state_from_a_peer(make_cluster) -> None:
    cluster = make_cluster(3, job="demo", config=CONFIG)
    cluster.start_all()
    final = run(returns_after_the_end(cluster))
    assert final["step"] == STEPS
    log = cluster.node("n3").log_path.read_text()
    assert "fetched the final checkpoint of step" in log, "n3 took the state from a peer"
    ledger = (cluster.node("n3").data_dir / "worker" / "ledger.jsonl").read_text().splitlines()
    assert not any(f'"step": {STEPS - 1},' in line for line in ledger), "n3 trained the last step itself"
    models = {n: torch.load(cluster.node(n).data_dir / "worker" / "final.pt", weights_only=True) for n in ("n1", "n3")}
    assert all(torch.equal(models["n1"][k], models["n3"][k]) for k in models["n1"]), "n3's final model differs"
