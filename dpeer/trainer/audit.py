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

Steps a committed checkpoint covers are folded into ``range`` records (ledger.py): the audit checks
a range's fingerprint against the seeded share of each of its steps and counts the range as a
trained and a committed record a step; it compares the digests a range kept (checkpoint steps,
a group's first step), not the losses or the other digests, which a range does not keep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from dpeer.channel.local import read_jsonl
from dpeer.trainer.ledger import DIGEST, RANGE, TRAINED, range_digests, share_print
from dpeer.trainer.sampler import GlobalBatchSampler, micro_batch_slice, shard, shard_bounds


def read_records(path: str) -> list[dict]:
    """Every record of one node's ledger, ranges as they are (a torn line, from a kill mid-write,
    is skipped)."""
    return read_jsonl(path)


def read_ledger(path: str) -> list[dict]:
    """One node's committed-step records, in order; a range gives one a step (its kept digest or
    "", loss None)."""
    out: list[dict] = []
    for r in read_jsonl(path):
        if r.get("kind") == RANGE:
            kept = dict(range_digests(r))
            out.extend({"kind": "committed", "step": s, "gen": r["gen"], "world": r["world"], "rank": r["rank"],
                        "digest": kept.get(s, ""), "loss": None} for s in range(r["first"], r["last"] + 1))
        elif r.get("kind") not in (TRAINED, DIGEST):
            out.append(r)
    return out


def step_digests(records: Sequence[dict]) -> dict[int, str]:
    """One node's digest of every digested step (its committed record's, the digest record that
    follows it, or the one a range kept), by step."""
    out: dict[int, str] = {}
    for r in records:
        if r.get("kind") == RANGE:
            out.update(range_digests(r))
        elif r.get("kind") != TRAINED and r.get("digest"):
            out[r["step"]] = r["digest"]
    return out


def seeded_share(expected: list[int], rank: int, world: int, micro_batch: int | None,
                 shares: Sequence[int] = ()) -> tuple[list[int] | None, list[int]]:
    """What rank of world (weighted by ``shares``) trains of a step whose seeded samples are
    ``expected``: (its micro-batches, their samples) in exact mode (``micro_batch`` given), (None,
    its contiguous share) in fast mode."""
    if micro_batch is None:
        return None, shard(expected, rank, world, shares)
    mine = list(range(*shard_bounds(len(expected) // micro_batch, rank, world, shares)))
    return mine, [i for j in mine for i in micro_batch_slice(expected, micro_batch, j)]


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
    """Audit every node's records (read_records) below step ``steps``: each step committed; for
    every committed (step, generation), each rank of that generation recorded what it trained, and
    together they trained the step's micro-batches (exact mode: ``micro_batch`` given) or its
    samples in rank order (fast mode) exactly once, with the seeded samples; no sample twice within
    an epoch; every range's fingerprint that of its ranks' seeded shares; replicas' digests equal at
    equal steps (exact mode: across generations too, since every lineage computes the same bits;
    fast mode: within a generation). Records of later steps (a run still training) are left out."""
    result = Audit()
    seeded = _memo(sampler.indices_for_step)
    seen = _Seen(steps, -1 if micro_batch else None)
    for node, records in ledgers.items():
        for e in records:
            if e.get("kind") == RANGE:
                _check_range(e, seeded, micro_batch, result)
            seen.take(node, e)
    committed, trained, digests = seen.committed, seen.trained, seen.digests
    fed: dict[int, list[int]] = {}
    for (step, gen), world in sorted(committed.items()):
        sequence = _check_group(step, gen, world, trained.get((step, gen), {}), seeded(step), micro_batch, result)
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


class _Seen:
    """What the records say, by (step, generation) below ``steps``: the committed groups' worlds,
    each rank's trained records (a range stands for its rank's), and the digests by scope
    (exact mode: the step alone, ``every_gen`` -1; fast mode: the step and the generation)."""

    def __init__(self, steps: int, every_gen: int | None) -> None:
        self.steps, self.every_gen = steps, every_gen
        self.committed: dict[tuple[int, int], int] = {}
        self.trained: dict[tuple[int, int], dict[int, list[dict]]] = {}
        self.digests: dict[tuple[int, int], dict[str, str]] = {}

    def take(self, node: str, e: dict) -> None:
        """Note one record of `node`'s ledger."""
        if e.get("kind") == RANGE:
            for s in range(e["first"], min(e["last"] + 1, self.steps)):
                self.committed[(s, e["gen"])] = e["world"]
                self.trained.setdefault((s, e["gen"]), {}).setdefault(e["rank"], []).append(e)
            for s, d in range_digests(e):
                if s < self.steps:
                    self._digest(node, s, e["gen"], d)
            return
        if e["step"] >= self.steps:
            return
        key = (e["step"], e["gen"])
        if e.get("kind") == TRAINED:
            self.trained.setdefault(key, {}).setdefault(e["rank"], []).append(e)
            return
        if e.get("kind") != DIGEST:
            self.committed[key] = e["world"]
        if e["digest"]:  # only every training.digest_every-th step carries one
            self._digest(node, e["step"], e["gen"], e["digest"])

    def _digest(self, node: str, step: int, gen: int, digest: str) -> None:
        scope = (step, gen if self.every_gen is None else self.every_gen)
        self.digests.setdefault(scope, {})[f"{node}@{gen}"] = digest


def _memo(fn: Callable[[int], list[int]]) -> Callable[[int], list[int]]:
    """fn with each step's answer kept (ranges and groups ask for the same steps' samples)."""
    seen: dict[int, list[int]] = {}

    def get(step: int) -> list[int]:
        if step not in seen:
            seen[step] = fn(step)
        return seen[step]
    return get


def _check_range(r: dict, seeded: Callable[[int], list[int]], micro_batch: int | None, result: Audit) -> None:
    """A range's fingerprint against its rank's seeded share of each of its steps, in order."""
    chain = ""
    for s in range(r["first"], r["last"] + 1):
        chain = share_print(chain, s, *seeded_share(seeded(s), r["rank"], r["world"], micro_batch, _shares(r)))
    if chain != r["trained"]:
        result.problems.append(f"steps {r['first']}..{r['last']} generation {r['gen']}: rank {r['rank']}'s folded "
                               f"records are not its seeded {'micro-batches' if micro_batch else 'share'} of each step")


def _check_group(step: int, gen: int, world: int, by_rank: dict[int, list[dict]], expected: list[int],
                 micro_batch: int | None, result: Audit) -> list[int] | None:
    """Check what the group of generation ``gen`` trained for ``step`` (whose seeded samples are
    ``expected``); the samples it fed, in stream order, or None when its records are incomplete."""
    where = f"step {step} generation {gen}"
    lost = [r for r in range(world) if len(by_rank.get(r, [])) != 1]
    if lost:
        result.problems.append(f"{where}: rank(s) {lost} of {world} left no single record of what they trained")
        return None
    result.groups_checked += 1
    records = [_as_trained(by_rank[r][0], expected, micro_batch) for r in range(world)]
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


def _as_trained(record: dict, expected: list[int], micro_batch: int | None) -> dict[str, Any]:
    """A rank's trained record of a step; for a range (its fingerprint checked apart), the seeded share."""
    if record.get("kind") != RANGE:
        return record
    micro_batches, indices = seeded_share(expected, record["rank"], record["world"], micro_batch, _shares(record))
    return {"rank": record["rank"], "micro_batches": micro_batches, "indices": indices}


def _shares(record: dict) -> tuple[int, ...]:
    """A record's generation's shares (none: even); what is not a list of positive integers reads as
    even, so a forged or torn record fails the check instead of raising."""
    shares = record.get("shares", ())
    ok = isinstance(shares, list) and all(type(s) is int and s > 0 for s in shares) and len(shares) == record["world"]
    return tuple(shares) if ok else ()


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
