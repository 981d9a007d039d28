"""The kv history check catches a broken read path: with tests/chaos/plant_stale_reads on
PYTHONPATH (its sitecustomize.py patches dpeer.daemon.serve.service in every daemon the run starts;
dpeer itself holds no test switch) a node that does not lead answers `kv get` from its own applied
state, without the leader's ReadIndex. While the seeded partition cuts a follower off, it serves
values the majority has since overwritten or deleted: the run must exit non-zero and the
"kv history linearizable" row must say which key. The committed logs still agree (the plant only
reads), and the acknowledged writes still read back at the end (the follower has caught up)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.chaos import run_chaos

PLANT = Path(__file__).parent / "plant_stale_reads"


def test_chaos_fails_on_a_build_that_serves_stale_reads(tmp_path: Path) -> None:
    path = os.pathsep.join(p for p in (str(PLANT), os.environ.get("PYTHONPATH", "")) if p)
    code, output, timeline = run_chaos(tmp_path, [
        "--nodes", "3", "--duration", "12", "--fault-every", "4", "--seed", "5", "--kinds", "partition",
        "--kv-every", "4", "--kv-op-every", "0.25", "--no-reference", "--warmup-timeout", "60",
    ], env={"PYTHONPATH": path})
    assert code == 1, output[-6000:]
    assert "partition" in [f["kind"] for f in timeline["faults"]], timeline["faults"]
    stale = timeline["checks"]["kv history linearizable"]
    assert stale and all(p.startswith("key 'chaos-5-r") and "not linearizable" in p for p in stale), stale
    assert "VIOLATION [kv history linearizable]" in output
    assert timeline["checks"]["committed prefixes equal"] == []
    assert timeline["checks"]["acknowledged kv writes readable from every node"] == []
