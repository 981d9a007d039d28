"""Training through real daemons: waits on the demo job's progress, the ledger audit and the
final models' comparisons that the real-process training tests share."""

from __future__ import annotations

import torch

from dpeer.trainer.audit import audit, read_records
from dpeer.trainer.demo import DEFAULTS
from dpeer.trainer.sampler import GlobalBatchSampler
from tests.support.daemons import Daemons, run

BATCH, MICRO_BATCH = 16, 8  # the global batch and micro-batch of the training tests' configs
TIMEOUT = 120.0


def steps_of(docs: dict, nodes: list[str]) -> dict[str, int]:
    return {n: (docs.get(n) or {}).get("train", {}) and docs[n]["train"]["step"] for n in nodes}


def world(doc: dict | None) -> int:
    return doc["group"]["world_size"] if doc and doc.get("group") else 0


async def training(cluster: Daemons, nodes: list[str], size: int, past: int = 0) -> dict:
    """Wait until `nodes` train in a group of `size`, each beyond step `past`."""
    def ok(docs: dict) -> bool:
        return all(world(docs.get(n)) == size and (docs[n].get("train") or {}).get("step", -1) > past
                   for n in nodes)
    return await cluster.wait_for(ok, TIMEOUT, f"{nodes} training in a group of {size} past step {past}")


async def finished(cluster: Daemons) -> None:
    def ok(docs: dict) -> bool:
        return all(d and d["worker"] and d["worker"]["done"] for d in docs.values())
    await cluster.wait_for(ok, 3 * TIMEOUT, "every worker done", interval=0.5)


def final_params(cluster: Daemons, node: str) -> dict[str, torch.Tensor]:
    return torch.load(cluster.node(node).data_dir / "worker" / "final.pt", weights_only=True)


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in a)


def assert_exact(cluster: Daemons, steps: int, finishers: list[str]) -> dict[str, torch.Tensor]:
    """Ledgers audit clean over `steps` and the finishers end identical; returns one final model."""
    sampler = GlobalBatchSampler(DEFAULTS["dataset_len"], BATCH, DEFAULTS["seed"])
    ledgers = {n.node_id: read_records(str(n.data_dir / "worker" / "ledger.jsonl")) for n in cluster.nodes}
    problems = audit(ledgers, steps, sampler, MICRO_BATCH)
    assert not problems, problems
    finals = {n: final_params(cluster, n) for n in finishers}
    assert max(max_rel_diff(finals[n], finals[finishers[0]]) for n in finishers) == 0.0, "replicas ended apart"
    return finals[finishers[0]]


def assert_matches_clean_run(cluster: Daemons, config: dict, final: dict[str, torch.Tensor]) -> None:
    """Train the same job on one box without failures; the final models agree within 1e-4."""
    reference = Daemons(cluster.root.parent / "reference", 1, job="demo", config=config)
    try:
        reference.start_all()
        run(finished(reference))
    finally:
        reference.stop_all()
    drift = max_rel_diff(final, final_params(reference, "n1"))
    assert drift < 1e-4, f"the run with failures drifted from the clean run by {drift:.2e}"
