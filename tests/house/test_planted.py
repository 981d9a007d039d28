"""Bugs this project fixed, planted back by monkeypatching (never in dpeer/): the whole-cluster
simulation must report each, and the same schedule without the plant must be clean."""

from __future__ import annotations

from typing import Any

import pytest

from dpeer.consensus import force as force_mod
from dpeer.consensus import follower as follower_mod
from dpeer.consensus.follower import Follower
from dpeer.daemon.node import resyncer as resyncer_mod
from dpeer.daemon.worker import link as link_mod
from dpeer.daemon.worker import reports as reports_mod
from dpeer.daemon.decide.worker_health import Health
from dpeer.ids import SECRETS, Ids
from dpeer.statemachine import store as store_mod

from tests.house import scenarios
from tests.house.cluster import quiet_logs
from tests.house.sim import run


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logs()


def plant_no_missed_view(mp: pytest.MonkeyPatch) -> None:
    """Before the missed-view loop: a worker handed no view after its box restarted just waits."""
    mp.setattr(reports_mod, "missed_view", lambda *a: Health(False, "planted: never missed"))


def plant_no_fence(mp: pytest.MonkeyPatch) -> None:
    """Before the fence: a box that knows no leader lets its worker train on."""
    mp.setattr(link_mod.WorkerLink, "_fence", lambda self, now: None)


def plant_no_store_identity(mp: pytest.MonkeyPatch) -> None:
    """Before store identities: a box on a new disk is indistinguishable from its old self."""
    uids: dict[str, str] = {}
    real_open = store_mod.Store.open.__func__

    def open_(cls: Any, path: Any, *, node_id: str | None = None, ids: Ids = SECRETS, **kw: Any) -> Any:
        return real_open(cls, path, node_id=node_id, ids=_FirstUid(uids, node_id or "", ids), **kw)

    mp.setattr(store_mod.Store, "open", classmethod(open_))


class _FirstUid:
    """An id source that hands a node id's first store uid to every later store of that id."""

    def __init__(self, uids: dict[str, str], node_id: str, ids: Ids) -> None:
        self.uids, self.node_id, self.ids = uids, node_id, ids

    def token_hex(self, nbytes: int) -> str:
        return self.uids.setdefault(self.node_id, self.ids.token_hex(nbytes))


def plant_unguarded_force(mp: pytest.MonkeyPatch) -> None:
    """Before the force guard: force proceeds wherever an operator runs it."""
    mp.setattr(force_mod, "force_refusal", lambda *a, **k: "")


def plant_trust_strangers(mp: pytest.MonkeyPatch) -> None:
    """Before identity checks on resync: committed entries are taken from any peer ahead of us."""
    mp.setattr(Follower, "_untrusted_source", lambda self, batch, sender, term: "")
    mp.setattr(follower_mod, "check_committed_batch", lambda batch, commit_index, lo: "")

    def on_heartbeat(self: Any, seen: Any) -> None:
        local = self.node.local_version
        if seen.hb.commit_index >= local.last_applied + self.min_gap:
            self._start(self.tracker.observe(local, seen.hb, True))

    mp.setattr(resyncer_mod.Resyncer, "on_heartbeat", on_heartbeat)


CASES = {
    "missed view": (plant_no_missed_view, scenarios.power_loss, {}, "training does not resume"),
    "minority fencing": (plant_no_fence, scenarios.minority_holds_the_group,
                         {"size": 5, "unready": frozenset({"n3", "n4", "n5"})}, "a minority keeps training"),
    # the founder's second life takes the real leader's entries under the identity its first life
    # held: its log lost what that identity acknowledged, and it never catches up
    "wiped voter under its old id": (plant_no_store_identity, scenarios.amnesia, {}, "training does not resume"),
    "force on a healthy follower": (plant_unguarded_force, scenarios.force_on_a_healthy_follower, {}, "committed"),
    "committed entries from a stranger": (plant_trust_strangers, scenarios.stranger, {}, "committed"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_schedule_is_clean_without_the_bug(case: str) -> None:
    _, scenario, kw, _ = CASES[case]
    result = run(1, seconds=10.0, scenario=scenario, **kw)
    assert result.violation is None, result.violation


@pytest.mark.parametrize("case", list(CASES))
def test_the_simulation_finds_the_planted_bug(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plant, scenario, kw, expected = CASES[case]
    plant(monkeypatch)
    result = run(1, seconds=10.0, scenario=scenario, **kw)
    assert result.violation is not None and expected in result.violation, result.violation
