"""Audits a run from its ledgers: no committed step lost, every sample consumed exactly once,
replicas that committed a step in the same generation identical. Pure over the ledger records;
used by the tests, the chaos tool and anyone checking a production run after the fact.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from dpeer.peer.local import read_jsonl
from dpeer.trainer.sampler import GlobalBatchSampler


def read_ledger(path: str) -> list[dict]:
    """One node's ledger records (a torn last line, from a kill mid-write, is skipped)."""
    return read_jsonl(path)


def audit(ledgers: Mapping[str, Sequence[dict]], steps: int, sampler: GlobalBatchSampler) -> list[str]:
    """Every violation found, as one sentence each; an empty list means the run was exact.

    A step is the unit of commit: every step below `steps` appears with its seeded indices and
    no sample appears twice within one epoch (a pass over the dataset). Replicas that committed a step in the same generation agree
    on the parameters' digest. (A step redone after the only rank that had committed it died is
    the survivors' lineage; the dead rank's entry stays in its ledger but its update is gone.)
    """
    problems: list[str] = []
    digests: dict[tuple[int, int], dict[str, str]] = {}
    indices_by_step: dict[int, list[int]] = {}
    for node, records in ledgers.items():
        for e in records:
            step = e["step"]
            if e["indices"] != sampler.indices_for_step(step):
                problems.append(f"{node} consumed other samples than the seeded ones at step {step}")
            if e["digest"]:  # only every training.digest_every-th step carries one
                digests.setdefault((step, e["gen"]), {})[node] = e["digest"]
            indices_by_step[step] = e["indices"]
    for (step, gen), by_node in sorted(digests.items()):
        if len(set(by_node.values())) > 1:
            problems.append(f"replicas disagree at step {step} generation {gen}: {by_node}")
    missing = sorted(set(range(steps)) - set(indices_by_step))
    if missing:
        problems.append(f"{len(missing)} committed steps missing, first {missing[:5]}")
    twice = _consumed_twice(indices_by_step, steps, sampler)
    if twice:
        problems.append(f"{twice} samples consumed twice within an epoch")
    return problems


def _consumed_twice(indices_by_step: Mapping[int, list[int]], steps: int, sampler: GlobalBatchSampler) -> int:
    """Samples seen more than once in the same epoch, counting stream positions step * batch + j."""
    seen: set[tuple[int, int]] = set()
    twice = 0
    for step in sorted(s for s in indices_by_step if s < steps):
        for j, index in enumerate(indices_by_step[step]):
            key = ((step * sampler.global_batch + j) // sampler.dataset_len, index)
            twice += key in seen
            seen.add(key)
    return twice
