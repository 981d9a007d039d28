"""The ledger audit: it must flag each kind of violation and pass an exact multi-epoch run."""

from __future__ import annotations

from dpeer.trainer.audit import audit
from dpeer.trainer.sampler import GlobalBatchSampler

SAMPLER = GlobalBatchSampler(dataset_len=20, global_batch=8, seed=3)
STEPS = 7  # 56 samples: almost three passes over 20


def ledger(steps: range, gen: int = 1, digest: str = "d") -> list[dict]:
    return [{"step": s, "gen": gen, "indices": SAMPLER.indices_for_step(s), "digest": f"{digest}{s}"} for s in steps]


def test_an_exact_run_over_several_epochs_passes() -> None:
    assert audit({"a": ledger(range(STEPS)), "b": ledger(range(STEPS))}, STEPS, SAMPLER) == []


def test_a_missing_step_is_flagged() -> None:
    problems = audit({"a": ledger(range(3)) + ledger(range(4, STEPS))}, STEPS, SAMPLER)
    assert any("missing" in p for p in problems)


def test_replicas_that_disagree_are_flagged() -> None:
    problems = audit({"a": ledger(range(STEPS)), "b": ledger(range(STEPS), digest="x")}, STEPS, SAMPLER)
    assert any("disagree" in p for p in problems)


def test_other_samples_than_the_seeded_ones_are_flagged() -> None:
    bad = ledger(range(STEPS))
    bad[2] = {**bad[2], "indices": list(reversed(bad[2]["indices"]))}
    problems = audit({"a": bad}, STEPS, SAMPLER)
    assert any("other samples" in p for p in problems)


def test_a_sample_twice_in_one_epoch_is_flagged() -> None:
    class Repeating(GlobalBatchSampler):
        def indices_for_step(self, step: int) -> list[int]:
            return [0] * self.global_batch

    sampler = Repeating(20, 8, 3)
    records = [{"step": s, "gen": 1, "indices": [0] * 8, "digest": "d"} for s in range(2)]
    problems = audit({"a": records}, 2, sampler)
    assert any("twice" in p for p in problems)


def test_steps_without_a_digest_are_not_compared() -> None:
    sparse = [{**e, "digest": ""} if e["step"] % 3 else e for e in ledger(range(STEPS))]
    assert audit({"a": ledger(range(STEPS)), "b": sparse}, STEPS, SAMPLER) == []
    wrong = [{**e, "digest": "x"} if e["step"] == 3 else e for e in sparse]
    assert any("disagree at step 3" in p for p in audit({"a": ledger(range(STEPS)), "b": wrong}, STEPS, SAMPLER))
