"""CI smoke chaos: 3 nodes, a short seeded schedule with a kill + restart, a partition and a hung
(SIGSTOPped) node (seed 5 draws them in that order), while a background writer commits kv puts; every check must pass."""

from __future__ import annotations

from pathlib import Path

from tests.support.chaos import run_chaos


def test_short_seeded_chaos_run_has_no_violations(tmp_path: Path, reference_cache: Path) -> None:
    code, output, timeline = run_chaos(tmp_path, [
        "--nodes", "3", "--duration", "45", "--fault-every", "4", "--seed", "5",
        "--kinds", "kill,partition,stop", "--reference-cache", str(reference_cache),
    ])
    assert code == 0, output[-6000:]
    kinds = [f["kind"] for f in timeline["faults"]]
    assert {"kill", "partition"} <= set(kinds), f"the schedule did not reach a kill and a partition: {kinds}"
    assert timeline["violations"] == 0
    assert timeline["kv"]["acknowledged"] > 0, "the background writer got no write acknowledged"
    assert all(f["back_s"] is not None for f in timeline["faults"]), timeline["faults"]
    figures = timeline["figures"]
    assert set(figures["final_digests"].values()) == {figures["reference_digest"]}, "not bitwise equal"
    assert "state-dict digest equal" in timeline["notes"]["final model = fault-free run"]
    assert timeline["not_run"] == {}
