"""Table tests of the leader's pure decisions on members, voters and views."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from dpeer.membership import MemberState
from dpeer.consensus.voting import ChangeOp
from dpeer.daemon.decide.speeds import RESHARE_EVERY
from dpeer.daemon.decide.proposals import (
    MembershipChange, Observed, change_began, decide_view, plan_voters, reconcile_members, training_members,
)
from dpeer.statemachine.entry import EntryKind
from dpeer.statemachine.payloads import ControlMode, MemberJoined, ViewChange
from dpeer.statemachine.state import ClusterState, Member
from dpeer.address import Address
from dpeer.view import View


def state(members: dict[str, str], voters=(), learners=(), view=None, control: str = "running") -> ClusterState:
    ms = {n: Member(f"10.0.0.{i}:7100", status, i) for i, (n, status) in enumerate(sorted(members.items()), 1)}
    return ClusterState(members=MappingProxyType(ms), voters=tuple(voters), learners=tuple(learners),
                        view=view, control=ControlMode(control))


def seen(**states: str) -> dict[str, Observed]:
    return {n: Observed(MemberState(s), f"h:{i}", since=10.0) for i, (n, s) in enumerate(states.items())}


@pytest.mark.parametrize(
    "members, gossip, kind, node",
    [
        ({"a": "active", "b": "active"}, seen(a="alive", b="alive"), None, None),
        ({"a": "active", "b": "active"}, seen(a="alive", b="dead"), EntryKind.MEMBER_DEAD, "b"),
        ({"a": "active", "b": "active"}, seen(a="alive", b="suspect"), None, None),
        ({"a": "active", "b": "active"}, seen(a="alive", b="left"), EntryKind.MEMBER_LEFT, "b"),
        ({"a": "active", "b": "dead"}, seen(a="alive", b="alive"), EntryKind.MEMBER_JOINED, "b"),
        ({"a": "active", "b": "left"}, seen(a="alive", b="alive"), None, None),
        ({"a": "active"}, seen(a="alive", z="alive"), None, None),
    ],
)
def test_reconcile_members(members, gossip, kind, node) -> None:
    d = reconcile_members(state(members), gossip)
    assert d.kind == kind, d.reason
    if node:
        assert d.proposal.node_id == node and d.reason


def test_a_member_back_alive_keeps_its_store_and_is_not_ready_until_it_says_so() -> None:
    # the bug: the payload named only the address, so the record came back ready (the rule's
    # default) with no store port or uid, and a restarted box whose worker had not even started
    # went into the next view: the whole group waited on it until its daemon said otherwise
    st = state({"a": "active", "b": "dead"})
    old = st.members["b"]
    members = dict(st.members)
    members["b"] = Member(old.addr, old.status, old.joined_index, 4321, True, "ab" * 16)
    st = ClusterState(members=MappingProxyType(members), view=st.view)
    d = reconcile_members(st, seen(a="alive", b="alive"))
    assert d.kind is EntryKind.MEMBER_JOINED
    assert d.proposal == MemberJoined("b", "h:1", 4321, False, "ab" * 16)


@pytest.mark.parametrize(
    "members, voters, learners, gossip, now, want, why",
    [
        ({"a": "active"}, ["a"], [], seen(a="alive"), 0, None, "as wanted"),
        ({"a": "active", "b": "active"}, ["a"], [], seen(a="alive", b="alive"), 0,
         ("add_learner", "b"), "learner"),
        ({"a": "active", "b": "active"}, ["a"], ["b"], seen(a="alive", b="alive"), 0,
         ("promote", "b"), "promote"),
        ({"a": "active", "b": "active"}, ["a"], ["b"], seen(a="alive", b="suspect"), 0, None, "as wanted"),
        ({"a": "active", "b": "left"}, ["a", "b"], [], seen(a="alive"), 0, ("remove", "b"), "left"),
        # at the cap, a voter dead past the grace period is demoted so a healthy learner can replace it
        ({"a": "active", "b": "active", "c": "active"}, ["a", "b"], ["c"],
         seen(a="alive", b="dead", c="alive"), 100.0, ("remove", "b"), "dead past"),
        # not yet past the grace period
        ({"a": "active", "b": "active", "c": "active"}, ["a", "b"], ["c"],
         seen(a="alive", b="dead", c="alive"), 15.0, None, "as wanted"),
        # no healthy learner: keep the dead voter rather than shrink the quorum
        ({"a": "active", "b": "active", "c": "active"}, ["a", "b"], ["c"],
         seen(a="alive", b="dead", c="dead"), 100.0, None, "as wanted"),
    ],
)
def test_plan_voters(members, voters, learners, gossip, now, want, why) -> None:
    d = plan_voters(state(members, voters, learners), gossip, now=now, grace=30.0, max_voters=2)
    assert why in d.reason
    if want is None:
        assert not d.propose
    else:
        assert d.kind == EntryKind.CONFIG_CHANGE
        assert (d.proposal.op, d.proposal.node) == want


def test_training_members_keep_survivor_order_and_append_newcomers() -> None:
    s = state({"a": "active", "b": "active", "c": "active", "d": "active", "e": "dead"},
              view=View(4, ("c", "a", "b"), Address.parse("h:1")))
    gossip = seen(a="alive", b="dead", c="alive", d="alive", e="alive")
    assert training_members(s, gossip).members == ["c", "a", "d"]


@pytest.mark.parametrize(
    "gossip, failed_generation, members, why",
    [
        # in view a, b (generation 4); c is active and not in it
        (seen(a="alive", b="alive", c="alive"), 0, ["a", "b", "c"], "every member"),
        (seen(a="alive", b="suspect", c="alive"), 0, ["a", "b", "c"], "b kept while suspect"),
        (seen(a="alive", b="suspect", c="alive"), 3, ["a", "b", "c"], "b kept while suspect"),  # stale report
        (seen(a="alive", b="suspect", c="alive"), 4, ["a", "c"], "b dropped: suspect and its group failed"),
        (seen(a="alive", b="dead", c="alive"), 0, ["a", "c"], "b dropped: dead"),
        (seen(a="alive", b="left", c="alive"), 0, ["a", "c"], "b dropped: left"),
        (seen(a="alive", b="alive", c="suspect"), 0, ["a", "b"], "c waits: suspect"),
        (seen(a="alive", b="alive", c="dead"), 0, ["a", "b"], "c waits: dead"),
        (seen(a="alive", b="alive"), 0, ["a", "b"], "c waits: unknown to gossip"),
        (seen(a="alive", b="alive", c="alive"), 4, ["a", "b", "c"], "every member"),
    ],
)
def test_training_members_hysteresis(gossip, failed_generation, members, why) -> None:
    s = state({"a": "active", "b": "active", "c": "active"}, view=View(4, ("a", "b"), Address.parse("h:1")))
    wanted = training_members(s, gossip, failed_generation)
    assert wanted.members == members and why in wanted.reason, wanted.reason


@pytest.mark.parametrize(
    "status, ready, gossip, why",
    [
        ("dead", True, "alive", "b dropped: dead"),  # committed dead, gossip not yet caught up
        ("left", True, "suspect", "b dropped: left"),
        ("active", False, "suspect", "b dropped: its worker is not ready"),
    ],
)
def test_a_member_of_the_view_is_dropped_whatever_gossip_says_once_not_active_or_not_ready(
    status, ready, gossip, why
) -> None:
    s = state({"a": "active", "b": "active"}, view=View(4, ("a", "b"), Address.parse("h:1")))
    s = ClusterState(members=MappingProxyType({**s.members, "b": Member("h:2", status, 2, 0, ready)}),
                     view=s.view)
    wanted = training_members(s, seen(a="alive", b=gossip))
    assert wanted.members == ["a"] and why in wanted.reason, wanted.reason


def test_decide_view_waits_for_quiet_window_then_proposes_next_generation() -> None:
    s = state({"a": "active", "b": "active"}, view=View(3, ("a",), Address.parse("10.0.0.1:8100")))
    ports = {"a": 8100, "b": 8101}
    early = decide_view(s, ["a", "b"], changed_at=10.0, now=10.05, quiet=0.1, store_port_of=ports)
    assert not early.propose and "waiting" in early.reason
    d = decide_view(s, ["a", "b"], changed_at=10.0, now=10.2, quiet=0.1, store_port_of=ports)
    assert d.kind == EntryKind.VIEW
    assert d.proposal == ViewChange(4, ("a", "b"), "10.0.0.1:8100")


def test_a_view_names_each_member_s_site_and_a_change_of_sites_alone_is_a_new_generation() -> None:
    s = state({"a": "active", "b": "active"}, view=View(3, ("a", "b"), Address.parse("10.0.0.1:8100"), "",
                                                         ("lab", "auto-b")))
    ports = {"a": 8100, "b": 8101}
    same = decide_view(s, ["a", "b"], 0.0, 100.0, 0.1, ports, sites={"a": "lab", "b": "auto-b"})
    assert not same.propose and "already has" in same.reason
    moved = decide_view(s, ["a", "b"], 0.0, 100.0, 0.1, ports, sites={"a": "lab", "b": "lab"})
    assert moved.proposal == ViewChange(4, ("a", "b"), "10.0.0.1:8100", sites=("lab", "lab"))
    assert "their sites changed" in moved.reason
    joined = decide_view(s, ["b", "a"], 0.0, 100.0, 0.1, ports, sites={"a": "lab", "b": "auto-b"})
    assert joined.proposal.sites == ("auto-b", "lab") and "sites" not in joined.reason


def test_a_view_gives_shares_by_speed_class_and_a_change_of_shares_alone_is_a_new_generation() -> None:
    s = state({"a": "active", "b": "active"}, view=View(3, ("a", "b"), Address.parse("10.0.0.1:8100"), "", (), (8, 4)))
    ports = {"a": 8100, "b": 8101}
    same = decide_view(s, ["a", "b"], 0.0, 100.0, 0.1, ports, classes={"a": 12, "b": 8})
    assert not same.propose and "already has" in same.reason  # unchanged shares: no new generation
    faster = decide_view(s, ["a", "b"], 0.0, 100.0, 0.1, ports, classes={"a": 12, "b": 12})
    assert faster.proposal == ViewChange(4, ("a", "b"), "10.0.0.1:8100", shares=())  # all equal: even
    assert "their shares changed" in faster.reason
    slower = decide_view(s, ["a", "b"], 0.0, 100.0, 0.1, ports, classes={"a": 12, "b": 4})
    assert slower.proposal.shares == (8, 2) and "their shares changed" in slower.reason
    unknown = decide_view(s, ["a", "b"], 0.0, 100.0, 0.1, ports, classes={"a": None, "b": 8})
    assert unknown.proposal.shares == () and "shares" in unknown.reason  # unknown: the full share, so even
    joined = decide_view(s, ["b", "a"], 0.0, 100.0, 0.1, ports, classes={"a": 12, "b": 8})
    assert joined.proposal.shares == (4, 8) and "shares" not in joined.reason  # in rank order
    held = decide_view(s, ["a", "b"], 0.0, 100.0, 0.1, ports, classes={"a": 12, "b": 4},
                       shares_since=100.0 - RESHARE_EVERY + 1.0)
    assert not held.propose and "wait 1.0s more" in held.reason  # the shares stood too short a time
    regrown = decide_view(s, ["a", "b", "c"], 0.0, 100.0, 0.1, {**ports, "c": 8102},
                          classes={"a": 12, "b": 4, "c": 12}, shares_since=100.0)
    assert regrown.proposal.shares == (8, 2, 8)  # a change of members takes the new shares at once
    # with the step's size known: a change of the shares that moves no micro-batch is not taken
    kept = decide_view(s, ["a", "b"], 0.0, 100.0, 0.1, ports, classes={"a": 12, "b": 4}, units=2)
    assert not kept.propose and "keeps its shares" in kept.reason and "1.00x" in kept.reason
    taken = decide_view(s, ["a", "b"], 0.0, 100.0, 0.1, ports, classes={"a": 12, "b": 4}, units=16)
    assert taken.proposal.shares == (8, 2) and "predicted time 0.65x" in taken.reason
    even = state({"a": "active", "b": "active"}, view=View(3, ("a", "b"), Address.parse("10.0.0.1:8100")))
    assert not decide_view(even, ["a", "b"], 0.0, 100.0, 0.1, ports, classes={"a": 5, "b": 5}).propose
    assert not decide_view(even, ["a", "b"], 0.0, 100.0, 0.1, ports).propose  # no classes given: even


@pytest.mark.parametrize(
    "view, members, control, why",
    [
        (View(1, ("a",), Address.parse("x:1")), ["a"], "running", "already has"),
        (None, [], "running", "no member"),
        (View(2, (), Address.read("")), ["a"], "paused", "paused"),
    ],
)
def test_decide_view_holds(view, members, control, why) -> None:
    s = state({"a": "active"}, view=view, control=control)
    d = decide_view(s, members, changed_at=0.0, now=100.0, quiet=0.1, store_port_of={"a": 1})
    assert not d.propose and why in d.reason


def test_a_pause_ends_the_training_group_with_an_empty_view_then_proposes_nothing() -> None:
    training = state({"a": "active", "b": "active"}, view=View(4, ("b", "a"), Address.parse("10.0.0.2:8")),
                     control="paused")
    stop = decide_view(training, ["b", "a"], changed_at=0.0, now=100.0, quiet=0.1, store_port_of={"a": 9, "b": 8})
    assert stop.proposal == ViewChange(5, (), "") and "paused" in stop.reason
    stopped = state({"a": "active", "b": "active"}, view=View(5, (), Address.read("")), control="paused")
    held = decide_view(stopped, ["a", "b"], changed_at=0.0, now=100.0, quiet=0.1, store_port_of={"a": 9, "b": 8})
    assert not held.propose and "dpeer job resume" in held.reason


def test_a_pause_before_any_view_tells_the_workers_with_an_empty_first_view() -> None:
    s = state({"a": "active"}, control="paused")
    d = decide_view(s, ["a"], changed_at=0.0, now=100.0, quiet=0.1, store_port_of={"a": 9})
    assert d.proposal == ViewChange(1, (), "")


def test_a_resume_with_no_ready_member_says_so() -> None:
    # every worker finished as the pause landed: none is ready, and that is the reason, not "the same members"
    s = state({"a": "active"}, view=View(5, (), Address.read("")))
    d = decide_view(s, [], changed_at=0.0, now=100.0, quiet=0.1, store_port_of={"a": 9})
    assert not d.propose and "no member is ready" in d.reason


def test_a_resume_after_a_pause_forms_every_ready_member_again() -> None:
    s = state({"a": "active", "b": "active"}, view=View(5, (), Address.read("")))
    wanted = training_members(s, seen(a="alive", b="alive"))
    assert wanted.members == ["a", "b"]
    d = decide_view(s, wanted.members, changed_at=0.0, now=100.0, quiet=0.1, store_port_of={"a": 9, "b": 8})
    assert d.proposal == ViewChange(6, ("a", "b"), "10.0.0.1:9")


def test_first_view_uses_rank0_host() -> None:
    s = state({"a": "active", "b": "active"})
    d = decide_view(s, ["b", "a"], changed_at=0.0, now=1.0, quiet=0.1, store_port_of={"a": 9, "b": 8})
    assert d.proposal.generation == 1 and d.proposal.store_host == "10.0.0.2:8"


@pytest.mark.parametrize("addr, store_host", [("[fd00::2]:7100", "[fd00::2]:8"), ("[]:7100", None)])
def test_rank0s_address_gives_the_store_host_or_a_reason(addr: str, store_host: str | None) -> None:
    s = state({"a": "active", "b": "active"})
    s = ClusterState(members=MappingProxyType({**s.members, "b": Member(addr, "active", 2, 8, True)}))
    d = decide_view(s, ["b", "a"], changed_at=0.0, now=1.0, quiet=0.1, store_port_of={"a": 9, "b": 8})
    if store_host is None:
        assert not d.propose and "rank 0 (b) has no usable address" in d.reason
    else:
        assert d.proposal.store_host == store_host


def test_members_whose_worker_is_not_ready_do_not_train() -> None:
    s = state({"a": "active", "b": "active"})
    s = ClusterState(members=MappingProxyType({**s.members, "b": Member("h:2", "active", 2, 0, False)}))
    wanted = training_members(s, seen(a="alive", b="alive"))
    assert wanted.members == ["a"] and "b waits: its worker is not ready" in wanted.reason


def test_a_failed_group_gets_a_new_generation_with_the_same_members() -> None:
    s = state({"a": "active"}, view=View(5, ("a",), Address.parse("10.0.0.1:8")))
    same = decide_view(s, ["a"], changed_at=0.0, now=1.0, quiet=0.1, store_port_of={"a": 8})
    assert not same.propose
    refresh = decide_view(s, ["a"], 0.0, 1.0, 0.1, {"a": 8}, failed_generation=5)
    assert refresh.proposal.generation == 6
    stale = decide_view(s, ["a"], 0.0, 1.0, 0.1, {"a": 8}, failed_generation=4)
    assert not stale.propose


def test_the_last_voter_is_never_removed_even_when_it_left() -> None:
    d = plan_voters(state({"a": "left"}, ["a"]), seen(a="alive"), now=0.0, grace=30.0, max_voters=5)
    assert not d.propose


@pytest.mark.parametrize("before, after, gossip, expected, why", [
    (None, ["a"], {}, 10.0, "first decision: now"),
    (["a", "b"], ["a"], {"b": ("suspect", 9.7)}, 9.7, "dropped suspect: since it was suspected"),
    (["a", "b", "c"], ["a"], {"b": ("dead", 9.2), "c": ("suspect", 9.6)}, 9.6, "the newest of the drops"),
    (["a", "b"], ["a"], {"b": ("alive", 9.0)}, 10.0, "dropped while alive (not ready): now"),
    (["a", "b"], ["a"], {"b": ("suspect", 0.0)}, 10.0, "a gossip time never seen: now"),
    (["a"], ["a", "b"], {"b": ("alive", 9.0)}, 10.0, "a newcomer: now"),
    (["a", "b"], ["a", "c"], {"b": ("dead", 9.0), "c": ("alive", 9.5)}, 10.0, "a drop and a newcomer: now"),
    (["a", "b"], ["a"], {}, 10.0, "unknown to gossip: now"),
])
def test_change_began_dates_a_gossip_drop_from_gossip(before, after, gossip, expected, why) -> None:
    observed = {n: Observed(MemberState(s), f"{n}:1", t) for n, (s, t) in gossip.items()}
    assert change_began(before, after, observed, 10.0) == expected, why


def test_quiet_window_is_short_only_for_drops_the_group_confirmed() -> None:
    from dpeer.daemon.decide.proposals import quiet_window

    seen = {"a": Observed(MemberState.ALIVE, "a:1", 0.0), "b": Observed(MemberState.SUSPECT, "b:1", 1.0), "c": Observed(MemberState.ALIVE, "c:1", 0.0)}
    cases = [  # before, after, group failed, expected
        (["a", "b", "c"], ["a", "c"], True, 0.02),   # a suspect dropped after its group failed
        (["a", "b", "c"], ["a", "c"], False, 0.1),   # no report from the group: the full window
        (["a", "b", "c"], ["a"], True, 0.1),         # c is alive: not explained by gossip
        (["a", "b"], ["a", "c"], True, 0.1),         # a newcomer joins too
        (["a", "c"], ["a", "c"], True, 0.1),         # nothing dropped (a same-member re-form)
        (None, ["a"], True, 0.1),                    # no earlier members known
    ]
    for before, after, failed, expected in cases:
        assert quiet_window(before, after, seen, failed, 0.1, 0.02) == expected, (before, after, failed)


def test_a_member_back_on_a_new_disk_is_removed_then_added_back_as_a_learner_with_its_new_uid() -> None:
    old, new = "1" * 32, "2" * 32
    ms = {"a": Member("10.0.0.1:7100", "active", 1, uid="a" * 32), "b": Member("10.0.0.2:7100", "active", 2, uid=new),
          "c": Member("10.0.0.3:7100", "active", 3, uid="c" * 32)}
    uids = {"a": "a" * 32, "b": old, "c": "c" * 32}
    before = ClusterState(members=MappingProxyType(ms), voters=("a", "b", "c"), uids=MappingProxyType(uids), epoch=1)
    gossip = seen(a="alive", b="alive", c="alive")
    d = plan_voters(before, gossip, now=0.0, grace=30.0, max_voters=5)
    assert (d.proposal.op, d.proposal.node) == ("remove", "b") and "new disk" in d.reason
    del uids["b"]
    after = ClusterState(members=MappingProxyType(ms), voters=("a", "c"), uids=MappingProxyType(uids), epoch=1)
    d = plan_voters(after, gossip, now=0.0, grace=30.0, max_voters=5)
    assert d.proposal == MembershipChange(ChangeOp.ADD_LEARNER, "b", new)
