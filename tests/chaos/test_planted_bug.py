"""The chaos checks catch a broken build: with tests/chaos/plant_skip_heal on PYTHONPATH (its
sitecustomize.py patches dpeer.trainer.heal in every worker the run starts; dpeer itself holds no
test switch) a restarted worker takes its peers' step but keeps its own stale parameters, so the
replicas diverge. The same chaos run must then exit non-zero and name it.
The first heal may be the one of a node whose worker joins the group late at start-up, or the
one after the seeded kill + restart; either diverges. A later heal picks one lineage
(decisions.pick_lineage) and the stale replica "receives" it again, keeping its own parameters:
--warmup-timeout and --finish-timeout bound the waits."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.chaos import run_chaos


PLANT = Path(__file__).parent / "plant_skip_heal"


def test_chaos_fails_on_a_build_that_skips_healing(tmp_path: Path, reference_cache: Path) -> None:
    path = os.pathsep.join(p for p in (str(PLANT), os.environ.get("PYTHONPATH", "")) if p)
    code, output, timeline = run_chaos(tmp_path, [
        "--nodes", "3", "--duration", "12", "--fault-every", "4", "--seed", "5", "--kinds", "kill",
        "--kv-every", "4", "--finish-timeout", "45", "--warmup-timeout", "60", "--reference-cache", str(reference_cache),
    ], env={"PYTHONPATH": path})
    assert code == 1, output[-6000:]
    assert "VIOLATION [replicas agree" in output and "replicas disagree" in output, output[-6000:]
    assert timeline["checks"]["replicas agree (digests at equal steps)"]
