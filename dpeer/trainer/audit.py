"""Audits a run from its ledgers: no committed step lost, every micro-batch (or sample) of every
committed step trained exactly once by the group that committed it, as the ranks themselves
recorded it, and replicas identical. Pure over the ledger records; used by the tests, the chaos
tool and anyone checking a production run after the fact.

A ledger holds two kinds of record per step and rank (dpeer/trainer/loop.py): ``trained``, written
before the step's allreduce (``micro_batches``: the step's micro-batch indices the rank ran, in
exact mode, else null; ``indices``: the dataset indices it fed its model), and ``committed``,
written once the allreduce returned (``digest``: the parameter-and-buffer digest at a checkpoint
or the last step, else ""; ``loss``); every digest_every-th step's digest is hashed beside the
next step and comes in a ``digest`` record of its own (the committed record's step, gen, world,
rank and ``digest``). A step committed in generation g is one with a committed record of
generation g; its group is that generation's ``world`` ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from dpeer.channel.local import read_jsonl
from dpeer.trainer.sampler import GlobalBatchSampler, micro_batch_slice

TRAINED = "trained"
DIGEST = "digest"  # a digested step's digest, hashed beside the next step and written once done


def read_records(path: str) -> list[dict]:
    """Every record of one node's ledger (a torn last line, from a kill mid-write, is skipped)."""
    return read_jsonl(path)


def read_ledger(path: str) -> list[dict]:
    """One node's committed-step records, in order."""
    return [r for r in read_jsonl(path) if r.get("kind") not in (TRAINED, DIGEST)]


def step_digests(records: Sequence[dict]) -> dict[int, str]:
    """One node's digest of every digested step (its committed record's, or the digest record that
    follows it), by step."""
    return {r["step"]: r["digest"] for r in records if r.get("kind") != TRAINED and r.get("digest")}


@dataclass
class Audit:
    """The audit's violations (one sentence each; none: the run was exact) and what it compared."""

    problems: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)  # those of problems where replicas' digests differ
    committed_steps: int = 0
    groups_checked: int = 0  # (step, generation) pairs whose trained records were checked
    micro_batches_checked: int = 0
    digests_compared: int = 0
    digest_steps: int = 0  # steps at which two or more digests were compared

    def summary(self, exact: bool) -> str:
        """What was checked, in a line (the chaos report's figure)."""
        return f"{self.trained_summary(exact)}; {self.digest_summary(exact)}"

    def trained_summary(self, exact: bool) -> str:
        """What the exactly-once check covered."""
        unit = "micro-batches" if exact else "rank shares"
        return (f"{self.committed_steps} committed steps in {self.groups_checked} (step, generation) groups, "
                f"{self.micro_batches_checked} {unit} each trained once")

    def digest_summary(self, exact: bool) -> str:
        """What the replicas' digest comparison covered."""
        scope = "at equal steps, any generation" if exact else "at equal steps within a generation"
        return f"{self.digests_compared} digests compared at {self.digest_steps} steps ({scope})"


def audit(ledgers: Mapping[str, Sequence[dict]], steps: int, sampler: GlobalBatchSampler,
          micro_batch: int | None = None) -> list[str]:
    """Every violation found (see audit_run); an empty list means the run was exact."""
    return audit_run(ledgers, steps, sampler, micro_batch).problems


def audit_run(ledgers: Mapping[str, Sequence[dict]], steps: int, sampler: GlobalBatchSampler,
              micro_batch: int | None = None) -> Audit:
    """Audit every node's records (read_records): each step below ``steps`` committed; for every
    committed (step, generation), each rank of that generation recorded what it trained, and
    together they trained the step's micro-batches (exact mode: ``micro_batch`` given) or its
    samples in rank order (fast mode) exactly once, with the seeded samples; no sample twice within
    an epoch; replicas' digests equal at equal steps (exact mode: across generations too, since
    every lineage computes the same bits; fast mode: within a generation)."""
    result = Audit()
    committed: dict[tuple[int, int], int] = {}
    trained: dict[tuple[int, int], dict[int, list[dict]]] = {}
    digests: dict[tuple[int, int], dict[str, str]] = {}
    for node, records in ledgers.items():
        for e in records:
            key = (e["step"], e["gen"])
            if e.get("kind") == TRAINED:
                trained.setdefault(key, {}).setdefault(e["rank"], []).append(e)
                continue
            if e.get("kind") != DIGEST:
                committed[key] = e["world"]
            if e["digest"]:  # only every training.digest_every-th step carries one
                scope = (e["step"], -1 if micro_batch else e["gen"])
                digests.setdefault(scope, {})[f"{node}@{e['gen']}"] = e["digest"]
    fed: dict[int, list[int]] = {}
    for (step, gen), world in sorted(committed.items()):
        sequence = _check_group(step, gen, world, trained.get((step, gen), {}), sampler, micro_batch, result)
        if sequence is not None:
            fed[step] = sequence
    _check_digests(digests, result)
    done = {s for s, _ in committed}
    result.committed_steps = len(done & set(range(steps)))
    missing = sorted(set(range(steps)) - done)
    if missing:
        result.problems.append(f"{len(missing)} committed steps missing, first {missing[:5]}")
    twice = _consumed_twice(fed, steps, sampler)
    if twice:
        result.problems.append(f"{twice} samples consumed twice within an epoch")
    return result


def _check_group(step: int, gen: int, world: int, by_rank: dict[int, list[dict]], sampler: GlobalBatchSampler,
                 micro_batch: int | None, result: Audit) -> list[int] | None:
    """Check what the group of generation ``gen`` trained for ``step``; the samples it fed, in
    stream order, or None when its records are incomplete."""
    where = f"step {step} generation {gen}"
    lost = [r for r in range(world) if len(by_rank.get(r, [])) != 1]
    if lost:
        result.problems.append(f"{where}: rank(s) {lost} of {world} left no single record of what they trained")
        return None
    result.groups_checked += 1
    records = [by_rank[r][0] for r in range(world)]
    expected = sampler.indices_for_step(step)
    if micro_batch is None:
        fed = [i for e in records for i in e["indices"]]
        if fed != expected:
            result.problems.append(f"{where}: the ranks' shares are not the step's seeded samples in rank order")
        result.micro_batches_checked += world
        return fed
    ran = sorted(j for e in records for j in (e["micro_batches"] or []))
    count = len(expected) // micro_batch
    if ran != list(range(count)):
        result.problems.append(f"{where}: micro-batches trained {ran}, expected each of 0..{count - 1} once")
        return None
    for e in records:
        want = [i for j in e["micro_batches"] for i in micro_batch_slice(expected, micro_batch, j)]
        if e["indices"] != want:
            result.problems.append(f"{where}: rank {e['rank']} fed other samples than its micro-batches' seeded ones")
    result.micro_batches_checked += count
    by_micro_batch = {j: micro_batch_slice(e["indices"], micro_batch, pos)
                      for e in records for pos, j in enumerate(e["micro_batches"])}
    return [i for j in range(count) for i in by_micro_batch[j]]


def _check_digests(digests: Mapping[tuple[int, int], Mapping[str, str]], result: Audit) -> None:
    for (step, gen), by_replica in sorted(digests.items()):
        if len(by_replica) > 1:
            result.digests_compared += len(by_replica)
            result.digest_steps += 1
        if len(set(by_replica.values())) > 1:
            where = f"step {step}" + (f" generation {gen}" if gen >= 0 else "")
            result.disagreements.append(f"replicas disagree at {where}: {dict(sorted(by_replica.items()))}")
            result.problems.append(result.disagreements[-1])


def _consumed_twice(fed: Mapping[int, list[int]], steps: int, sampler: GlobalBatchSampler) -> int:
    """Samples seen more than once in the same epoch, counting stream positions step * batch + j."""
    seen: set[tuple[int, int]] = set()
    twice = 0
    for step in sorted(s for s in fed if s < steps):
        for j, index in enumerate(fed[step]):
            key = ((step * sampler.global_batch + j) // sampler.dataset_len, index)
            twice += key in seen
            seen.add(key)
    return twice
