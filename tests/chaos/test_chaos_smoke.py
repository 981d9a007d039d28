"""CI smoke chaos: 3 nodes, a short seeded schedule with a kill + restart, a partition, a stranger
on the data plane and a hung (SIGSTOPped) node (seed 5 draws them in that order; the stranger also
visits the workers while the first group forms), while a background writer commits kv puts and
three kv clients put, read and delete; every check must pass, the kv history linearizable and the
committed logs equal among them, each with the figures it checked."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.chaos import run_chaos


def test_short_seeded_chaos_run_has_no_violations(tmp_path: Path, reference_cache: Path) -> None:
    code, output, timeline = run_chaos(tmp_path, [
        "--nodes", "3", "--duration", "45", "--fault-every", "4", "--seed", "5",
        "--kinds", "kill,partition,stop,stranger", "--reference-cache", str(reference_cache),
    ])
    assert code == 0, output[-6000:]
    kinds = [f["kind"] for f in timeline["faults"]]
    assert {"kill", "partition", "stranger"} <= set(kinds), f"the schedule missed a kill, a partition or a stranger: {kinds}"
    assert timeline["violations"] == 0
    assert timeline["kv"]["acknowledged"] > 0, "the background writer got no write acknowledged"
    assert all(f["back_s"] is not None for f in timeline["faults"]), timeline["faults"]
    figures = timeline["figures"]
    assert set(figures["final_digests"].values()) == {figures["reference_digest"]}, "not bitwise equal"
    assert "state-dict digest equal" in timeline["notes"]["final model = fault-free run"]
    assert timeline["not_run"] == {}
    notes = timeline["notes"]
    ops, keys, unknown, states = map(int, re.match(
        r"(\d+) operations on (\d+) keys \((\d+) without an answer, \d+ unanswered reads left out\), (\d+) search states",
        notes["kv history linearizable"]).groups())
    assert ops >= 50 and keys == 3 and states >= ops - unknown, notes["kv history linearizable"]
    assert {op["kind"] for op in timeline["history"]} == {"put", "get", "delete"}
    compared = re.match(r"3 nodes \(n1 (\d+)\.\.(\d+), .*\), (\d+) entries compared pairwise", notes["committed prefixes equal"])
    assert compared and int(compared.group(3)) > 100, notes["committed prefixes equal"]
    stranger = timeline["stranger"]
    assert stranger["ran"] and stranger["store_sets"] > 0, stranger
    # its requests on the store's own wire reached a store that refused them (review of issue 35)
    requests = stranger["requests"]
    assert requests["refused"] > 0 and requests["ran"] == 0 and stranger["requests_run"] == [], stranger
    assert timeline["checks"]["stranger's store requests refused"] == []
    assert f"{requests['refused']} refused" in notes["stranger's store requests refused"]
    window = re.search(r"chaos window: (\d+) of (\d+) operations answered", notes["kv history linearizable"])
    assert window and int(window.group(1)) > 0, notes["kv history linearizable"]
    assert stranger["connections"].get("formation", 0) > 0 and stranger["connections"].get("training", 0) > 0, stranger
    assert "stranger on the data plane:" in output
