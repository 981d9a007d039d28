"""Real daemons of mixed speeds: box 2 runs in a cgroup that gets a quarter of a core. Its worker
measures its speed, its daemon commits its speed class, the leader gives it the smaller share of a
step, and the parameters at a step trained under those shares are the same bits as the same job
trained to that step on one box (exact mode: the split changes who runs which micro-batch, not the
bits)."""

from __future__ import annotations

from typing import Any

import pytest

from dpeer.chaos import slow_core
from dpeer.channel.local import read_reports
from tests.support.daemons import WAIT, run

DIGEST_EVERY = 20
TRAINING = {"global_batch": 64, "micro_batch": 8, "threads": 1, "reduction": "exact", "checkpoint_every": 0,
            "spare_worker": False, "digest_every": DIGEST_EVERY, "options": {"dim": 128, "hidden": 512}}
ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture
def slow():
    reason = slow_core.why_not()
    if reason:
        pytest.skip(reason)
    core = slow_core.SlowCore(0.25, "test")
    yield core
    core.close()


def _shares(doc: dict[str, Any] | None) -> dict[str, int]:
    group = (doc or {}).get("group") or {}
    return dict(zip(group.get("members", ()), group.get("shares") or ()))


def test_a_slowed_box_gets_the_smaller_share_and_keeps_the_one_box_bits(slow, make_cluster) -> None:
    # `slow` first: its cgroup is removed after the daemons in it were stopped
    mixed = make_cluster(2, job="demo", config={"training": {**TRAINING, "steps": 100000}}, env=ENV,
                         placement=lambda i: ("127.0.0.1", [] if i == 1 else slow.prefix()))
    mixed.start_all()

    def slow_share(docs: dict) -> bool:
        shares = _shares(docs.get("n1"))
        return len(shares) == 2 and shares["n2"] < shares["n1"] and bool((docs["n1"].get("train") or {}))

    async def scenario() -> tuple[dict, dict]:
        docs = await mixed.wait_for(slow_share, 5 * WAIT, "n2's share of a step below n1's")
        classes = {m["node_id"]: m["speed_class"] for m in docs["n1"]["members"]}
        assert classes["n2"] < classes["n1"], classes  # the quarter core measured slower
        since = docs["n1"]["train"]["latest_step"]
        later = await mixed.wait_for(lambda d: d.get("n1") is not None and (d["n1"].get("train") or {}).get(
            "step", 0) >= since + DIGEST_EVERY and _shares(d["n1"]) == _shares(docs["n1"]), 5 * WAIT,
            f"a digest at least {DIGEST_EVERY} steps after step {since}, under the same shares")
        return docs, later

    docs, later = run(scenario())
    mixed.stop_all()
    step, digest = later["n1"]["train"]["step"], later["n1"]["train"]["params_digest"]
    formed = [r for r in read_reports(str(mixed.node("n2").data_dir / "worker"), "n2") if r.get("kind") == "formed"]
    assert any(r.get("shares") == docs["n1"]["group"]["shares"] for r in formed), formed

    solo = make_cluster(1, job="demo", config={"training": {**TRAINING, "steps": step}}, env=ENV)
    solo.start_all()
    alone = run(solo.wait_for(lambda d: ((d.get("n1") or {}).get("job") or {}).get("state") == "finished", 8 * WAIT,
                              f"the one-box run finished at step {step}"))
    assert alone["n1"]["job"]["step"] == step and alone["n1"]["job"]["digest"] == digest, (alone["n1"]["job"], step,
                                                                                          digest)
