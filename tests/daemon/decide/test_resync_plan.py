"""Table tests of resync planning and of the no-repeated-propagation tracker."""

from __future__ import annotations

import pytest

from dpeer.membership import Heartbeat
from dpeer.daemon.decide.resync_plan import FetchEntries, LocalVersion, Nothing, ResyncTracker, plan_resync


def hb(term: int, last_applied: int, commit: int, node: str = "p") -> Heartbeat:
    return Heartbeat(node, f"{node}:1", 0, term, last_applied, commit, 0.0)


@pytest.mark.parametrize(
    "local, peer, expected",
    [
        ((2, 10, 10), hb(2, 10, 10), Nothing),  # equal
        ((2, 12, 12), hb(2, 10, 10), Nothing),  # ahead
        ((3, 5, 5), hb(2, 20, 20), Nothing),  # peer's term is below ours: cannot verify
        ((2, 10, 10), hb(2, 15, 12), FetchEntries("p", 11, 12, "")),  # only committed entries
        ((2, 10, 10), hb(2, 15, 10), Nothing),  # nothing new is committed
        ((2, 10, 10), hb(4, 30, 30), FetchEntries("p", 11, 30, "")),  # higher term is fine
        ((0, 0, 0), hb(1, 5, 5), FetchEntries("p", 1, 5, "")),  # empty node
        ((2, 10, 10), hb(4, 30, 30, "x"), Nothing),  # x is no member of the configuration in force
    ],
)
def test_plan(local: tuple[int, int, int], peer: Heartbeat, expected: object) -> None:
    plan = plan_resync(LocalVersion(*local), peer, member=peer.node_id != "x")
    assert plan.reason
    if expected is Nothing:
        assert isinstance(plan, Nothing)
    else:
        assert type(plan) is type(expected)
        assert {k: v for k, v in vars_of(plan).items() if k != "reason"} == {
            k: v for k, v in vars_of(expected).items() if k != "reason"
        }


def vars_of(obj: object) -> dict[str, object]:
    return {k: getattr(obj, k) for k in obj.__slots__}  # type: ignore[attr-defined]


def test_no_repeated_propagation_and_resume() -> None:
    t = ResyncTracker()
    local = LocalVersion(2, 10, 10)
    first = t.observe(local, hb(2, 20, 20, "a"), True)
    assert first == FetchEntries("a", 11, 20, first.reason)
    for who in ("a", "b", "c"):  # the same version, gossiped by many
        assert isinstance(t.observe(local, hb(2, 20, 20, who), True), Nothing)
    assert isinstance(t.observe(local, hb(2, 18, 18, "b"), True), Nothing)
    assert isinstance(t.observe(local, hb(2, 25, 25, "b"), True), Nothing)  # remembered for later
    # the fetch failed after applying up to 14: resume from 15, up to the newest version seen
    nxt = t.finished(LocalVersion(2, 14, 14))
    assert nxt == FetchEntries("b", 15, 25, nxt.reason)
    done = t.finished(LocalVersion(2, 25, 25))
    assert isinstance(done, Nothing) and t.in_flight is None
    again = t.observe(LocalVersion(2, 25, 25), hb(2, 26, 26, "c"), True)
    assert again == FetchEntries("c", 26, 26, again.reason)


def test_a_non_member_is_never_a_resync_source_nor_remembered_for_later() -> None:
    t = ResyncTracker()
    local = LocalVersion(2, 10, 10)
    assert "not a member" in t.observe(local, hb(9, 50, 50, "x"), False).reason
    assert t.in_flight is None
    t.observe(local, hb(2, 20, 20, "a"), True)
    t.observe(local, hb(9, 50, 50, "x"), False)
    assert isinstance(t.finished(LocalVersion(2, 20, 20)), Nothing)  # x's version was not kept
