"""The status document's speed fields: each member's committed speed_class beside its site, the view's shares."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace

from dpeer.address import Address
from dpeer.daemon.serve.status import group, members
from dpeer.membership import MemberRecord, MemberState
from dpeer.statemachine.state import ClusterState, Member
from dpeer.view import View


def _node(view: View) -> SimpleNamespace:
    committed = {"a": Member("a:1", "active", 1, speed_class=12), "b": Member("b:1", "active", 2)}
    state = ClusterState(members=MappingProxyType(committed), view=view)
    gossip = [MemberRecord(n, f"{n}:1", MemberState.ALIVE, 0) for n in ("a", "b", "c")]  # c: not committed yet
    return SimpleNamespace(id="a", reads=SimpleNamespace(state=state), swim=SimpleNamespace(members=lambda: gossip),
                           probes=SimpleNamespace(rtt_ms=lambda n: None))


def test_each_member_shows_its_speed_class_null_while_unknown_beside_its_site() -> None:
    rows = members(_node(View(1, ("a", "b"), Address.parse("a:2"))))  # type: ignore[arg-type]
    assert [(r["node_id"], r["site"], r["speed_class"]) for r in rows] == [("a", None, 12), ("b", None, None),
                                                                          ("c", None, None)]


def test_the_group_shows_its_shares_empty_when_even() -> None:
    weighted, even = (_node(View(2, ("a", "b"), Address.parse("a:2"), shares=shares)) for shares in ((8, 4), ()))
    assert group(weighted)["shares"] == [8, 4]  # type: ignore[arg-type, index]
    assert group(even)["shares"] == []  # type: ignore[arg-type, index]
