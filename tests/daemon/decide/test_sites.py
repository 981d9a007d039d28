"""Sites (daemon/decide/sites.py): configured names, near links judged with hysteresis, single linkage."""

from __future__ import annotations

import math

import pytest

from dpeer.daemon.decide.sites import (
    FAR_MS, NEAR_MS, SiteInput, assign_sites, committed_sites, near_peers, site_problem,
)
from dpeer.daemon.serve.status import site_of
from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.state import ClusterState, apply_many
from dpeer.daemon.config import NodeConfig
from dpeer.daemon.serve.admission import check_id
from dpeer.errors import BadRequest
from dpeer.view import valid_site


@pytest.mark.parametrize("name, problem", [
    ("lab-2", ""), ("eu-west-1.a", ""), ("Shop_Floor", ""), ("x" * 64, ""),
    ("", "not a site name"), ("lab 2", "not a site name"), ("-lab", "not a site name"), ("x" * 65, "not a site name"),
    ("lab/2", "not a site name"), ("auto-n1", "starts with 'auto-'"),
    ("lab\n", "not a site name"),  # a line break would end the status table's row
])
def test_a_configured_site_name(name: str, problem: str) -> None:
    assert (problem in site_problem(name)) if problem else site_problem(name) == ""


@pytest.mark.parametrize("samples, before, near", [
    ({"b": [0.4, 0.5, 0.6], "c": [30.0, 31.0, 29.0]}, (), ("b",)),  # LAN and WAN
    ({"b": [0.5, 0.5, 80.0]}, (), ("b",)),  # a slow probe does not move the floor
    ({"b": [51.0, 75.0, 2.0, 60.0, 48.0]}, (), ("b",)),  # a peer starved of CPU: late answers, a near floor
    ({"b": [30.0, 45.0, 31.0, 90.0]}, ("b",), ()),  # a WAN link: no probe comes back under 30 ms
    ({"b": [15.0, 16.0, 15.0]}, (), ()),  # between the thresholds: far stays far
    ({"b": [15.0, 15.0, 15.0]}, ("b",), ("b",)),  # ... and near stays near
    ({"b": [NEAR_MS] * 3}, (), ()),  # the threshold itself is not under it
    ({"b": [FAR_MS] * 3}, ("b",), ("b",)),  # a near link turns far only over FAR_MS
    ({"b": [FAR_MS + 0.1] * 3}, ("b",), ()),
    ({"b": []}, ("b",), ("b",)),  # no sample: as it was (a box just restarted)
    ({}, ("b",), ("b",)),  # ... or a peer that answers nothing now
    ({"b": []}, (), ()),
    ({"d": [1.0], "b": [2.0]}, (), ("b", "d")),  # sorted
])
def test_near_peers_with_hysteresis(samples: dict, before: tuple, near: tuple) -> None:
    assert near_peers(samples, before) == near


@pytest.mark.parametrize("samples, before, near", [
    ({"b": [math.nan, 1.0]}, (), ("b",)),  # min() of a NaN first was NaN: the near link read far
    ({"b": [1.0, math.nan]}, (), ("b",)),  # ... and near with the NaN last
    ({"b": [math.nan, 30.0]}, ("b",), ()),
    ({"b": [math.nan]}, ("b",), ("b",)),  # no real round trip: as it was
    ({"b": [-5.0, 30.0]}, (), ()),  # no round trip takes less than nothing: not near of itself
    ({"b": [math.inf, 30.0]}, ("b",), ()),  # an endless round trip is far
])
def test_round_trips_that_are_no_durations_are_no_evidence(samples: dict, before: tuple, near: tuple) -> None:
    assert near_peers(samples, before) == near


def test_a_link_that_flaps_around_the_threshold_is_judged_once() -> None:
    """Round trips swinging between 8 and 18 ms: once near, the box keeps saying so; a far one stays far."""
    near: tuple[str, ...] = ()
    history = []
    window: list[float] = []
    for rtt in [5.0, 5.0, 5.0, 18.0, 8.0, 18.0, 18.0, 8.0, 18.0, 18.0, 18.0, 18.0]:
        window = (window + [rtt])[-8:]
        near = near_peers({"b": window}, near)
        history.append(near)
    assert set(history) == {("b",)}
    assert near_peers({"b": [25.0] * 8}, near) == ()


S = SiteInput


@pytest.mark.parametrize("members, previous, sites", [
    # configured sites win, whatever the round trips say
    ({"a": S("x", ("b",)), "b": S("y", ("a",)), "c": S("x")}, {}, {"a": "x", "b": "y", "c": "x"}),
    # two LANs joined by a slow link: single linkage over near links
    ({"a": S("", ("b",)), "b": S("", ("a",)), "c": S("", ("d",)), "d": S("", ("c",))}, {},
     {"a": "auto-a", "b": "auto-a", "c": "auto-c", "d": "auto-c"}),
    # asymmetric or missing measurements: one side saying near links them
    ({"a": S("", ("b",)), "b": S(""), "c": S("", ("b",))}, {}, {"a": "auto-a", "b": "auto-a", "c": "auto-a"}),
    # a chain links its ends (single linkage), even when the ends measured nothing of each other
    ({"a": S("", ("b",)), "b": S("", ("c",)), "c": S("", ("d",)), "d": S("")}, {}, dict.fromkeys("abcd", "auto-a")),
    # near peers that are not members (dead, left) link nothing
    ({"a": S("", ("z",)), "b": S("", ("z",))}, {}, {"a": "auto-a", "b": "auto-b"}),
    # configured and measured side by side: a configured box is in no measured group
    ({"a": S("lab"), "b": S("", ("a", "c")), "c": S("")}, {}, {"a": "lab", "b": "auto-b", "c": "auto-b"}),
    # the smallest id left: the group keeps its name
    ({"b": S("", ("c",)), "c": S("")}, {"a": "auto-a", "b": "auto-a", "c": "auto-a"}, {"b": "auto-a", "c": "auto-a"}),
    # a newcomer joins a group and takes its name
    ({"a": S("", ("b",)), "b": S("", ("a", "0")), "0": S("")}, {"a": "auto-a", "b": "auto-a"},
     dict.fromkeys("ab0", "auto-a")),
    # a split: the part holding most of the old group keeps its name, the other gets a new one
    ({"a": S(""), "b": S("", ("c",)), "c": S("")}, dict.fromkeys("abc", "auto-a"),
     {"a": "auto-a.2", "b": "auto-a", "c": "auto-a"}),
    # a merge: the larger old group's name wins
    ({"a": S("", ("c",)), "b": S("", ("c",)), "c": S("")}, {"a": "auto-a", "b": "auto-b", "c": "auto-b"},
     dict.fromkeys("abc", "auto-b")),
    # a configured name held before does not pass to a measured group
    ({"a": S(""), "b": S("")}, {"a": "lab", "b": "lab"}, {"a": "auto-a", "b": "auto-b"}),
    ({}, {}, {}),
])
def test_assign_sites(members: dict, previous: dict, sites: dict) -> None:
    assert dict(assign_sites(members, previous).of) == sites


def test_the_reason_says_who_is_where_and_why() -> None:
    reason = assign_sites({"a": S("lab"), "b": S("", ("c",)), "c": S("")}, {}).reason
    assert reason == f"lab: a (configured); auto-b: b, c (round trips under {NEAR_MS:g} ms link them)"


def test_the_answer_does_not_depend_on_the_order_members_come_in() -> None:
    members = {"d": S("", ("c",)), "a": S("", ("b",)), "c": S(""), "b": S("")}
    reordered = dict(sorted(members.items()))
    assert assign_sites(members, {}) == assign_sites(reordered, {})


def test_committed_sites_read_active_records_and_keep_the_view_s_names() -> None:
    joined = [(EntryKind.MEMBER_JOINED, {"node_id": n, "addr": f"{n}:1", **extra}) for n, extra in
              (("a", {"near": ["b"]}), ("b", {}), ("c", {"site": "lab"}), ("d", {"near": ["a"]}))]
    specs = joined + [
        (EntryKind.VIEW, {"generation": 1, "members": ["a", "b", "c"], "store_host": "h:9",
                          "sites": ["auto-b", "auto-b", "lab"]}),
        (EntryKind.MEMBER_DEAD, {"node_id": "b"}),
    ]
    state, results = apply_many(ClusterState(), [Entry(i, 1, k, p) for i, (k, p) in enumerate(specs, 1)])
    assert all(r.accepted for r in results)
    assert dict(committed_sites(state).of) == {"a": "auto-b", "c": "lab", "d": "auto-b"}


def test_status_shows_the_view_s_site_else_the_configured_one() -> None:
    specs = [(EntryKind.MEMBER_JOINED, {"node_id": "a", "addr": "a:1", "site": "lab"}),
             (EntryKind.MEMBER_JOINED, {"node_id": "b", "addr": "b:1"}),
             (EntryKind.MEMBER_JOINED, {"node_id": "c", "addr": "c:1", "site": "lab-3"}),
             (EntryKind.VIEW, {"generation": 1, "members": ["a", "b"], "store_host": "h:9", "sites": ["lab", "auto-b"]})]
    state, _ = apply_many(ClusterState(), [Entry(i, 1, k, p) for i, (k, p) in enumerate(specs, 1)])
    assert [site_of(state, n) for n in "abcz"] == ["lab", "auto-b", "lab-3", None]
    older, _ = apply_many(ClusterState(), [Entry(i, 1, k, p) for i, (k, p) in enumerate(specs[:3], 1)])
    assert [site_of(older, n) for n in "abc"] == ["lab", None, "lab-3"]


@pytest.mark.parametrize("node_id", ["0:x", "n\u00e9", "n1\n", "-n1", "a" * 65])
def test_a_join_refuses_a_node_id_that_no_box_can_be_configured_with(node_id: str) -> None:
    """The join's check is the config's rule, so every member's measured site auto-<id> is a site
    name (a printable id such as 0:x made the leader's next view invalid for its whole group)."""
    with pytest.raises(BadRequest, match="must be a node id"):
        check_id(node_id, "node_id")
    check_id("Box_3.lab-2", "node_id")


@pytest.mark.parametrize("node_id", ["n1", "a" * 64, "Box_3.lab-2"])
def test_every_configurable_node_id_names_a_measured_site(node_id: str) -> None:
    assert valid_site(assign_sites({node_id: SiteInput()}, {}).of[node_id])


@pytest.mark.parametrize("node_id", ["n1\n", "-n1", "n 1", "a" * 65])
def test_a_node_id_outside_the_rule_is_refused_by_the_config(node_id: str) -> None:
    """A trailing line break passed the rule's `$` (config.py): its measured site auto-<id> is no site."""
    with pytest.raises(ValueError, match="node ids are 1-64"):
        NodeConfig(node_id=node_id)
