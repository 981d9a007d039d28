"""The ledger's compaction: steps a committed checkpoint covers fold into a range a run, the audit
reads both forms and still catches what it caught, and a rewrite (or a kill around it) loses no
record."""

from __future__ import annotations

import json
import os

import pytest

from dpeer.trainer import ledger as ledger_mod
from dpeer.trainer.audit import audit, audit_run, read_ledger, read_records, step_digests
from dpeer.trainer.ledger import LedgerFile, compact, range_digests
from dpeer.trainer.sampler import shard, shard_bounds, micro_batch_slice

from tests.trainer.test_audit import MICRO, SAMPLER, records, run_audit

STEPS = 40  # over 15 epochs of the 20-sample dataset


def as_lines(recs: list[dict]) -> list[str]:
    return [json.dumps(r) for r in recs]


def folded(ledgers: dict[str, list[dict]], below: int) -> dict[str, list[dict]]:
    """Every ledger compacted below `below`, read back as records."""
    out = {}
    for node, recs in ledgers.items():
        lines = compact(as_lines(recs), below)
        out[node] = [json.loads(line) for line in (lines if lines is not None else as_lines(recs))]
    return out


def with_digest_records(recs: list[dict], every: int) -> list[dict]:
    """A ledger as the loop writes it with digest_every=`every`: committed records carry a digest
    only at every 10th step (checkpoints); the others' come in digest records after the next step."""
    out = []
    for r in recs:
        if r["kind"] == "committed" and r["step"] % 10 != 9:
            out.append({**r, "digest": ""})
            if r["step"] % every == every - 1 or r["step"] == 0:
                out.append({"kind": "digest", **{k: r[k] for k in ("step", "gen", "world", "rank", "digest")}})
        else:
            out.append(r)
    return out


@pytest.mark.parametrize("exact", [True, False])
def test_a_folded_run_audits_clean_with_every_step_and_group_checked(exact: bool) -> None:
    ledgers = records(range(STEPS), 3, exact=exact)
    before = audit_run(ledgers, STEPS, SAMPLER, MICRO if exact else None)
    after = audit_run(folded(ledgers, 30), STEPS, SAMPLER, MICRO if exact else None)
    assert before.problems == [] and after.problems == []
    assert (after.committed_steps, after.groups_checked, after.micro_batches_checked) == \
           (before.committed_steps, before.groups_checked, before.micro_batches_checked)
    compacted = folded(ledgers, 30)["n1"]
    assert [r["kind"] for r in compacted][:1] == ["range"] and len(compacted) == 1 + 2 * (STEPS - 30)
    assert compacted[0]["first"] == 0 and compacted[0]["last"] == 29


@pytest.mark.parametrize("exact", [True, False])
def test_a_folded_run_of_uneven_shares_is_checked_against_its_shares(exact: bool) -> None:
    ledgers = records(range(STEPS), 3, exact=exact, shares=(1, 2, 8))  # not the even split
    compacted = folded(ledgers, 30)
    assert compacted["n1"][0]["kind"] == "range" and compacted["n1"][0]["shares"] == [1, 2, 8]
    assert audit(compacted, STEPS, SAMPLER, MICRO if exact else None) == []
    evened = {n: [{k: v for k, v in r.items() if k != "shares"} for r in recs] for n, recs in compacted.items()}
    assert any("folded records are not its seeded" in p for p in audit(evened, STEPS, SAMPLER, MICRO if exact else None))


def test_folding_twice_extends_the_range_and_equals_folding_once() -> None:
    ledgers = records(range(STEPS), 2)
    once = compact(as_lines(ledgers["n0"]), 35)
    twice = compact(compact(as_lines(ledgers["n0"]), 12), 35)
    assert once == twice and json.loads(once[0])["last"] == 34
    assert compact(once, 35) is None  # nothing left to fold below 35


def test_read_ledger_and_step_digests_see_through_ranges(tmp_path) -> None:
    recs = records(range(STEPS), 1)["n0"]
    lines = compact(as_lines(recs), 20)
    assert lines is not None
    compacted = [json.loads(line) for line in lines]
    (tmp_path / "ledger.jsonl").write_text("".join(line + "\n" for line in lines))
    expanded = read_ledger(str(tmp_path / "ledger.jsonl"))
    assert [e["step"] for e in expanded] == list(range(STEPS))
    assert expanded[-1]["digest"] == f"d{STEPS - 1}" and expanded[5]["digest"] == "d5"  # committed digests kept
    assert expanded[5]["loss"] is None and expanded[25]["loss"] == 1.0
    assert step_digests(compacted) == step_digests(recs)


def test_a_range_keeps_checkpoint_digests_and_a_groups_first_and_drops_the_rest() -> None:
    recs = with_digest_records(records(range(STEPS), 1)["n0"], every=5)
    range_ = json.loads(compact(as_lines(recs), 30)[0])
    assert range_digests(range_) == [(0, "d0"), (9, "d9"), (19, "d19"), (29, "d29")]
    # a disagreement at a kept step is still found after folding; one at a dropped step no longer is
    other = records(range(STEPS), 1, gen=2, digest="x")["n0"]
    assert any("disagree at step 9" in p for p in run_audit(folded({"a": recs, "b": other}, 30), steps=STEPS))


def test_a_folded_rank_that_fed_other_samples_is_flagged_by_its_range() -> None:
    for exact in (True, False):
        ledgers = records(range(STEPS), 2, exact=exact)
        trained = ledgers["n1"][10]  # step 5, rank 1
        ledgers["n1"][10] = {**trained, "indices": list(reversed(trained["indices"]))}
        problems = audit(folded(ledgers, 30), STEPS, SAMPLER, MICRO if exact else None)
        assert any("steps 0..29 generation 1: rank 1's folded records are not its seeded" in p for p in problems), \
            problems


def test_a_folded_micro_batch_trained_twice_is_flagged() -> None:
    ledgers = records(range(STEPS), 2)
    ledgers["n1"][4] = {**ledgers["n1"][4], "micro_batches": [1, 3]}  # step 2, rank 1
    assert any("rank 1's folded records" in p for p in run_audit(folded(ledgers, 30), steps=STEPS))


def test_a_rank_killed_between_trained_and_committed_keeps_its_trained_record() -> None:
    """Rank 2 trained step 12 and died before its commit; the others committed it, and a new
    generation (of two) redid nothing. Its lone trained record is never folded away."""
    three = records(range(13), 3)
    del three["n2"][-1]  # n2's committed record of step 12
    two = records(range(13, STEPS), 2, gen=2)
    ledgers = {"n0": three["n0"] + two["n0"], "n1": three["n1"] + two["n1"], "n2": three["n2"]}
    compacted = folded(ledgers, 30)
    assert [r["kind"] for r in compacted["n2"]] == ["range", "trained"] and compacted["n2"][1]["step"] == 12
    assert run_audit(compacted, steps=STEPS) == []
    lost = {**compacted, "n2": compacted["n2"][:1]}
    assert any("step 12 generation 1: rank(s) [2] of 3" in p for p in run_audit(lost, steps=STEPS))


def test_ranges_split_at_generations_and_the_audit_passes_across_a_world_change() -> None:
    first = records(range(10), 2, gen=1)
    then = records(range(10, STEPS), 3, gen=4)
    ledgers = {n: first.get(n, []) + then[n] for n in then}
    compacted = folded(ledgers, 35)
    assert [(r["gen"], r["first"], r["last"]) for r in compacted["n0"] if r["kind"] == "range"] == [(1, 0, 9), (4, 10, 34)]
    assert run_audit(compacted, steps=STEPS) == []


def test_the_audit_leaves_out_steps_past_its_bound() -> None:
    """A run still training: a range or records past `steps` do not make the audit of the first
    `steps` fail (a later step's records may not all be read yet)."""
    ledgers = records(range(STEPS), 2)
    ledgers["n1"] = [r for r in ledgers["n1"] if r["step"] != 33]  # n1's step 33 not read yet
    assert run_audit(folded(ledgers, 20), steps=30) == []


def test_torn_lines_are_dropped_and_unknown_records_kept() -> None:
    lines = as_lines(records(range(5), 1)["n0"])
    lines.insert(3, '{"kind": "trai')
    lines.append(json.dumps({"kind": "note", "what": "kept"}))
    out = compact(lines, 5)
    assert out is not None and [json.loads(line)["kind"] for line in out] == ["range", "note"]


# -- the file --------------------------------------------------------------------------------------

def write_steps(ledger: LedgerFile, steps: range, world: int = 1, rank: int = 0, gen: int = 1) -> None:
    """What the loop writes for `steps`: a trained record before each step's sums, then its commit."""
    for s in steps:
        indices = SAMPLER.indices_for_step(s)
        mbs = list(range(*shard_bounds(len(indices) // MICRO, rank, world)))
        fed = [i for j in mbs for i in micro_batch_slice(indices, MICRO, j)]
        base = {"step": s, "gen": gen, "world": world, "rank": rank}
        ledger.write({**base, "kind": "trained", "micro_batches": mbs, "indices": fed})
        ledger.write({**base, "kind": "committed", "digest": f"d{s}", "loss": 1.0})


def test_a_fold_rewrites_the_file_and_later_records_go_to_the_new_one(tmp_path) -> None:
    path = str(tmp_path / "ledger.jsonl")
    ledger = LedgerFile(path)
    write_steps(ledger, range(20))
    size = os.path.getsize(path)
    assert ledger.fold(15) and os.path.getsize(path) < size / 3
    write_steps(ledger, range(20, 30))
    ledger.close()
    recs = read_records(path)
    assert [r["kind"] for r in recs][:1] == ["range"] and recs[-1]["step"] == 29
    assert audit({"a": recs}, 30, SAMPLER, MICRO) == []
    assert os.listdir(tmp_path) == ["ledger.jsonl"]
    assert not ledger.fold(15)  # nothing new below 15


def test_each_record_reaches_the_kernel_when_written(tmp_path) -> None:
    """A trained record is in the file (no user-space buffer) as soon as write returns, also right
    after a fold reopened it."""
    path = str(tmp_path / "ledger.jsonl")
    ledger = LedgerFile(path)
    write_steps(ledger, range(3))
    ledger.fold(3)
    ledger.write({"kind": "trained", "step": 3, "gen": 1, "world": 1, "rank": 0, "micro_batches": [0], "indices": [1]})
    assert read_records(path)[-1]["step"] == 3
    ledger.close()


def test_a_kill_before_the_rename_leaves_the_old_ledger_whole_and_the_next_worker_cleans_up(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "ledger.jsonl")
    ledger = LedgerFile(path)
    write_steps(ledger, range(20))
    before = open(path).read()

    def killed(src: str, dst: str) -> None:
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(ledger_mod.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        ledger.fold(15)
    monkeypatch.undo()
    assert open(path).read() == before and len(os.listdir(tmp_path)) == 2  # the old ledger and the temp file
    os.rename(f"{path}.{os.getpid()}.tmp", f"{path}.{os.getpid() + 1}.tmp")  # the dead worker's
    with open(path, "a") as f:  # and the worker died mid-write of its next record
        f.write('{"kind": "trained", "step": 20, "ge')
    after = LedgerFile(path)  # the restarted worker: a new generation, from the checkpoint of step 15
    write_steps(after, range(15, 30), gen=2)
    assert os.listdir(tmp_path) == ["ledger.jsonl"]
    assert after.fold(25)
    after.close()
    recs = read_records(path)
    assert [(r["gen"], r["first"], r["last"]) for r in recs if r["kind"] == "range"] == [(1, 0, 19), (2, 15, 24)]
    assert audit({"a": recs}, 30, SAMPLER, MICRO) == []


def test_a_fast_mode_file_folds_and_audits(tmp_path) -> None:
    path = str(tmp_path / "ledger.jsonl")
    ledger = LedgerFile(path)
    for s in range(12):
        for kind, extra in (("trained", {"micro_batches": None, "indices": shard(SAMPLER.indices_for_step(s), 0, 1)}),
                            ("committed", {"digest": "", "loss": 0.5})):
            ledger.write({"kind": kind, "step": s, "gen": 1, "world": 1, "rank": 0, **extra})
    assert ledger.fold(10)
    ledger.close()
    assert audit({"a": read_records(path)}, 12, SAMPLER, None) == []


def test_the_head_keeps_the_newest_digests_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_mod, "DIGESTS_KEPT", 5)
    first = records(range(12), 1, gen=1)["n0"]
    then = records(range(12, STEPS), 1, gen=2)["n0"]
    lines = compact(as_lines(first + then), 30)
    assert lines is not None
    ranges = [json.loads(line) for line in lines if '"range"' in line]
    assert [range_digests(r) for r in ranges] == [[], [(s, f"d{s}") for s in range(25, 30)]]
    assert run_audit({"n0": [json.loads(line) for line in lines]}, steps=STEPS) == []


def test_folds_on_their_thread_lose_no_record_written_meanwhile(tmp_path) -> None:
    """The loop asks for a fold at each checkpoint and writes on; every record reaches the ledger."""
    path = str(tmp_path / "ledger.jsonl")
    ledger = LedgerFile(path)
    for block in range(0, 400, 20):
        write_steps(ledger, range(block, block + 20))
        ledger.fold_later(max(0, block - 10))
    ledger.close()
    recs = read_records(path)
    assert audit({"a": recs}, 400, SAMPLER, MICRO) == []
    assert sum(r["kind"] == "range" for r in recs) == 1 and os.listdir(tmp_path) == ["ledger.jsonl"]
    assert [e["step"] for e in read_ledger(path)] == list(range(400))


def test_a_digest_written_after_its_step_was_folded_is_folded_at_the_next_fold() -> None:
    """Without checkpoints a fold's bound is the current step: the step before it is hashed beside
    the next one, so its digest record lands after the fold; the next fold takes it in."""
    recs = records(range(STEPS), 1)["n0"]
    first = compact(as_lines(recs[:20]), 10)  # steps 0..9 trained and committed, then folded
    late = {"kind": "digest", "step": 9, "gen": 1, "world": 1, "rank": 0, "digest": "late9"}
    lines = compact(first + [json.dumps(late)] + as_lines(recs[20:]), 30)
    assert lines is not None and '"late9"' not in "".join(lines) and len(lines) == 1 + 2 * (STEPS - 30)
    assert run_audit({"n0": [json.loads(line) for line in lines]}, steps=STEPS) == []
