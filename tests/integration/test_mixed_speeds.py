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

    first: dict[int, dict] = {}  # generation -> n1's first status seen under it with n2's share below n1's

    def trained_slow(docs: dict) -> bool:
        """A digest at least DIGEST_EVERY steps after a generation with the slow split was first seen,
        that generation still standing (generations only grow, so it stood all along)."""
        n1 = docs.get("n1") or {}
        shares, train = _shares(n1), n1.get("train") or {}
        if not (len(shares) == 2 and shares["n2"] < shares["n1"] and train):
            return False
        seen = first.setdefault(n1["group"]["generation"], n1)
        return train.get("step", 0) >= seen["train"]["latest_step"] + DIGEST_EVERY

    async def scenario() -> tuple[dict, dict]:  # (n1 when the split was first seen, all later)
        later = await mixed.wait_for(trained_slow, 10 * WAIT,
                                     f"a digest {DIGEST_EVERY} steps into a generation that gives n2 the smaller share")
        return first[later["n1"]["group"]["generation"]], later

    chosen, later = run(scenario())
    mixed.stop_all()
    classes = {m["node_id"]: m["speed_class"] for m in chosen["members"]}
    assert classes["n2"] < classes["n1"], classes  # the quarter core measured slower
    # a box starved of CPU answers late, but its link's floor is loopback's: one site
    assert len(set(later["n1"]["group"]["sites"])) == 1, later["n1"]["group"]
    step, digest = later["n1"]["train"]["step"], later["n1"]["train"]["params_digest"]
    formed = [r for r in read_reports(str(mixed.node("n2").data_dir / "worker"), "n2") if r.get("kind") == "formed"]
    assert any(r.get("shares") == chosen["group"]["shares"] for r in formed), formed

    solo = make_cluster(1, job="demo", config={"training": {**TRAINING, "steps": step}}, env=ENV)
    solo.start_all()
    alone = run(solo.wait_for(lambda d: ((d.get("n1") or {}).get("job") or {}).get("state") == "finished", 8 * WAIT,
                              f"the one-box run finished at step {step}"))
    assert alone["n1"]["job"]["step"] == step and alone["n1"]["job"]["digest"] == digest, (alone["n1"]["job"], step,
                                                                                          digest)
