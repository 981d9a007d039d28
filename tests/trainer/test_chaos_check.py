"""The chaos tool's training checks (dpeer/trainer/chaos_check.py): each row says what it compared;
exact reduction compares final models by digest, fast by the max difference, and a reference that
was not run reads "not run", never "ok"."""

from __future__ import annotations

from pathlib import Path

import torch

from dpeer.trainer.chaos_check import AUDIT, FINAL_REPLICAS, FINISHED, REFERENCE, REPLICAS, check
from dpeer.trainer.demo import DEFAULTS
from dpeer.trainer.sampler import GlobalBatchSampler, micro_batch_slice, shard_bounds

BATCH, MICRO, STEPS = 16, 8, 3


def ledger(path: Path, rank: int, world: int, digest: str = "d") -> str:
    import json

    sampler = GlobalBatchSampler(DEFAULTS["dataset_len"], BATCH, 1234)
    lines = []
    for s in range(STEPS):
        mbs = list(range(*shard_bounds(BATCH // MICRO, rank, world)))
        fed = [i for j in mbs for i in micro_batch_slice(sampler.indices_for_step(s), MICRO, j)]
        base = {"step": s, "gen": 1, "world": world, "rank": rank}
        lines += [{**base, "kind": "trained", "micro_batches": mbs, "indices": fed},
                  {**base, "kind": "committed", "digest": f"{digest}{s}", "loss": 1.0}]
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    return str(path)


def final(path: Path, value: float) -> str:
    torch.save({"w": torch.full((3,), value), "n": torch.tensor(4)}, path)
    return str(path)


def spec(tmp: Path, finals: dict[str, float], reference: float | None, reduction: str = "exact") -> dict:
    return {"ledgers": {n: ledger(tmp / f"{n}.jsonl", r, 2) for r, n in enumerate(["a", "b"])},
            "finals": {n: final(tmp / f"{n}.pt", v) for n, v in finals.items()}, "steps": STEPS,
            "global_batch": BATCH, "micro_batch": MICRO, "reduction": reduction, "max_rel_diff": 1e-4,
            "reference_final": None if reference is None else final(tmp / "ref.pt", reference),
            "reference_skipped": "not run (--no-reference)" if reference is None else None}


def test_an_exact_run_equal_to_its_reference_says_digest_equal(tmp_path: Path) -> None:
    rows = check(spec(tmp_path, {"a": 1.0, "b": 1.0}, 1.0))["checks"]
    assert all(r["ran"] and not r["problems"] for r in rows.values()), rows
    assert "6 micro-batches each trained once" in rows[AUDIT]["note"]
    assert "6 digests compared at 3 steps (at equal steps, any generation)" in rows[REPLICAS]["note"]
    assert rows[FINISHED]["note"] == "2 of 2 nodes saved a final model"
    assert rows[FINAL_REPLICAS]["note"].startswith("state-dict digest equal (") and "over 2 models" in rows[FINAL_REPLICAS]["note"]
    assert rows[REFERENCE]["note"].startswith("state-dict digest equal")


def test_a_one_ulp_difference_is_a_violation_in_exact_mode_only(tmp_path: Path) -> None:
    near = float(torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)))
    rows = check(spec(tmp_path, {"a": 1.0, "b": 1.0}, near))["checks"]
    assert rows[REFERENCE]["problems"] and "max relative difference 1.19e-07" in rows[REFERENCE]["problems"][0]
    fast = check(spec(tmp_path, {"a": 1.0, "b": 1.0}, near, reduction="fast"))["checks"]
    assert not fast[REFERENCE]["problems"]
    assert fast[REFERENCE]["note"].startswith("max relative difference 1.19e-07 (fast reduction")


def test_without_a_reference_the_row_says_not_run(tmp_path: Path) -> None:
    rows = check(spec(tmp_path, {"a": 1.0, "b": 2.0}, None))["checks"]
    assert rows[REFERENCE] == {"problems": [], "note": "not run (--no-reference)", "ran": False}
    assert rows[FINAL_REPLICAS]["problems"], "replicas that differ passed"
