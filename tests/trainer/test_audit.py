"""The ledger audit: it must flag each kind of violation, from what the ranks recorded they trained,
and pass an exact multi-epoch run in either reduction mode."""

from __future__ import annotations

from dpeer.trainer.audit import audit, audit_run
from dpeer.trainer.sampler import GlobalBatchSampler, micro_batch_slice, shard, shard_bounds

SAMPLER = GlobalBatchSampler(dataset_len=20, global_batch=8, seed=3)
MICRO = 2  # 4 micro-batches per step
STEPS = 7  # 56 samples: almost three passes over 20


def records(steps: range, world: int, exact: bool = True, gen: int = 1, digest: str = "d",
            shares: tuple[int, ...] = ()) -> dict[str, list[dict]]:
    """The ledgers a fault-free group of `world` (its steps split by `shares`) writes, one node per
    rank, as the loop writes them."""
    out: dict[str, list[dict]] = {f"n{r}": [] for r in range(world)}
    for s in steps:
        indices = SAMPLER.indices_for_step(s)
        for r in range(world):
            if exact:
                mbs = list(range(*shard_bounds(len(indices) // MICRO, r, world, shares)))
                fed = [i for j in mbs for i in micro_batch_slice(indices, MICRO, j)]
            else:
                mbs, fed = None, shard(indices, r, world, shares)
            base = {"step": s, "gen": gen, "world": world, "rank": r}
            split = {"shares": list(shares)} if shares else {}
            out[f"n{r}"].append({**base, "kind": "trained", **split, "micro_batches": mbs, "indices": fed})
            out[f"n{r}"].append({**base, "kind": "committed", "digest": f"{digest}{s}", "loss": 1.0})
    return out


def run_audit(ledgers: dict[str, list[dict]], exact: bool = True, steps: int = STEPS) -> list[str]:
    return audit(ledgers, steps, SAMPLER, MICRO if exact else None)


def test_an_exact_run_over_several_epochs_passes_in_any_world_size() -> None:
    for world in (1, 2, 3, 5):  # world 5 > 4 micro-batches: one rank trains none
        assert run_audit(records(range(STEPS), world)) == [], world
        assert run_audit(records(range(STEPS), world, exact=False), exact=False) == [], world


def test_a_run_split_by_uneven_shares_passes() -> None:
    for shares in ((8, 4), (8, 1), (1, 8)):  # 4 micro-batches: 3/1, 4/0, 0/4
        assert run_audit(records(range(STEPS), 2, shares=shares)) == [], shares
        assert run_audit(records(range(STEPS), 2, exact=False, shares=shares), exact=False) == [], shares


def test_the_figures_say_what_was_compared() -> None:
    result = audit_run(records(range(STEPS), 2), STEPS, SAMPLER, MICRO)
    assert (result.committed_steps, result.groups_checked, result.micro_batches_checked) == (STEPS, STEPS, 4 * STEPS)
    assert (result.digests_compared, result.digest_steps) == (2 * STEPS, STEPS)
    assert "28 micro-batches each trained once; 14 digests compared at 7 steps" in result.summary(exact=True)


def test_a_missing_step_is_flagged() -> None:
    ledgers = records(range(STEPS), 2)
    ledgers = {n: [e for e in led if e["step"] != 3] for n, led in ledgers.items()}
    assert any("1 committed steps missing, first [3]" in p for p in run_audit(ledgers))


def test_replicas_that_disagree_are_flagged() -> None:
    ledgers = {**records(range(STEPS), 2), "late": records(range(STEPS), 1, gen=2, digest="x")["n0"]}
    assert any("disagree at step 0:" in p for p in run_audit(ledgers))  # exact: across generations
    fast = {**records(range(STEPS), 2, exact=False), "late": records(range(STEPS), 1, False, 2, "x")["n0"]}
    assert run_audit(fast, exact=False) == []  # fast: only within a generation
    fast["n1"][1] = {**fast["n1"][1], "digest": "y"}
    assert any("disagree at step 0 generation 1" in p for p in run_audit(fast, exact=False))


def test_a_micro_batch_trained_twice_and_one_never_is_flagged() -> None:
    ledgers = records(range(STEPS), 2)
    trained = ledgers["n1"][4]  # step 2, rank 1: micro-batches 2 and 3
    ledgers["n1"][4] = {**trained, "micro_batches": [1, 3]}
    problems = run_audit(ledgers)
    assert any("step 2 generation 1: micro-batches trained [0, 1, 1, 3]" in p for p in problems), problems


def test_a_rank_that_fed_other_samples_than_its_micro_batches_is_flagged() -> None:
    ledgers = records(range(STEPS), 2)
    trained = ledgers["n0"][6]
    ledgers["n0"][6] = {**trained, "indices": list(reversed(trained["indices"]))}
    assert any("step 3 generation 1: rank 0 fed other samples" in p for p in run_audit(ledgers))
    fast = records(range(STEPS), 2, exact=False)
    fast["n1"][2] = {**fast["n1"][2], "indices": fast["n0"][2]["indices"]}  # rank 1 trained rank 0's share
    assert any("step 1 generation 1: the ranks' shares" in p for p in run_audit(fast, exact=False))


def test_a_rank_without_a_trained_record_is_flagged_but_one_killed_after_the_commit_is_not() -> None:
    ledgers = records(range(STEPS), 3)
    del ledgers["n2"][8]  # step 4, rank 2: no trained record
    assert any("step 4 generation 1: rank(s) [2] of 3 left no single record" in p for p in run_audit(ledgers))
    killed = records(range(STEPS), 3)
    del killed["n2"][9]  # rank 2 trained step 4 and died before recording the commit: the others did
    assert run_audit(killed) == []


def test_a_sample_twice_in_one_epoch_is_flagged() -> None:
    class Repeating(GlobalBatchSampler):
        def indices_for_step(self, step: int) -> list[int]:
            return [0] * self.global_batch

    sampler = Repeating(20, 8, 3)
    ledgers = {"a": [{"kind": "trained", "step": s, "gen": 1, "world": 1, "rank": 0, "micro_batches": [0, 1, 2, 3],
                      "indices": [0] * 8} for s in range(2)]
               + [{"kind": "committed", "step": s, "gen": 1, "world": 1, "rank": 0, "digest": "d"} for s in range(2)]}
    assert any("twice" in p for p in audit(ledgers, 2, sampler, MICRO))


def test_steps_without_a_digest_are_not_compared() -> None:
    ledgers = records(range(STEPS), 2)
    sparse = [{**e, "digest": ""} if e.get("digest") and e["step"] % 3 else e for e in ledgers["n1"]]
    assert run_audit({"n0": ledgers["n0"], "n1": sparse}) == []
    wrong = [{**e, "digest": "x"} if e["step"] == 3 and e["kind"] == "committed" else e for e in sparse]
    assert any("disagree at step 3" in p for p in run_audit({"n0": ledgers["n0"], "n1": wrong}))
