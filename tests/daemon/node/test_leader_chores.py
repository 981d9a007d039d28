"""LeaderChores.decide wiring: gossip, a failed-group report and the clock reach the pure view decisions."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType, SimpleNamespace

from dpeer.consensus import Role
from dpeer.consensus.config import LAN
from dpeer.daemon.decide.sightings import Sightings
from dpeer.membership import MemberState
from dpeer.daemon.decide.failures import FailurePhase, FailureReport
from dpeer.daemon.decide.speeds import RESHARE_EVERY
from dpeer.daemon.node.leader_chores import LeaderChores
from dpeer.daemon.timing import LEADER_PRESETS
from dpeer.daemon.decide.proposals import Observed
from dpeer.statemachine.entry import EntryKind
from dpeer.statemachine.payloads import MemberJoined
from dpeer.statemachine.state import ClusterState, JobState, Member
from dpeer.address import Address
from dpeer.view import View


class FakeNode(SimpleNamespace):
    """The part of Node that LeaderChores reads: role, identity, applied state, gossip, clock."""

    def observed(self) -> dict[str, Observed]:
        since = getattr(self, "since", {})
        return {n: Observed(MemberState(s), f"10.0.0.{i}:7100", since.get(n, 0.0)) for i, (n, s) in enumerate(self.gossip.items(), 1)}

    def poke(self) -> None:
        pass

    def chores_now(self) -> None:
        pass

    def chores_at(self, when: float) -> None:
        self.woken_at = when


def chores(b_gossip: str) -> tuple[LeaderChores, FakeNode]:
    uids = {"a": "a" * 32, "b": "b" * 32}
    members = {"a": Member("10.0.0.1:7100", "active", 1, 7101, True, uids["a"]),
               "b": Member("10.0.0.2:7100", "active", 2, 7201, True, uids["b"])}
    state = ClusterState(members=MappingProxyType(members), voters=("a", "b"),
                         view=View(4, ("a", "b"), Address.parse("10.0.0.1:7101")), uids=MappingProxyType(uids), epoch=1)
    node = FakeNode(id="a", addr="10.0.0.1:7100", role=Role.LEADER, reads=SimpleNamespace(state=state, uid=uids["a"]),
                    raft_config=LAN, gossip={"a": "alive", "b": b_gossip}, clock=lambda: 11.0,
                    sightings=Sightings("a", 0.0))
    node.timers = node
    box = SimpleNamespace(leaving=False, store_port=lambda: 7101, ready=lambda: True, site=lambda: ("", ()),
                          speed_class=lambda: None)
    return LeaderChores(node, LEADER_PRESETS["lan"], box), node


def collective_failed(error: str, step: int = 7) -> FailureReport:
    return FailureReport("b", FailurePhase.GROUP, step, error, 4)


def test_a_suspect_member_stays_until_its_group_fails_then_goes_without_the_failure_grace() -> None:
    leader, _ = chores("suspect")
    assert leader.decide(10.0) is None and leader.decide(11.0) is None
    leader.group_failed(4, collective_failed("allreduce timed out"))
    assert leader.decide(11.0) is None  # the wanted members changed: the quiet window starts
    d = leader.decide(11.0 + leader.quiet + 0.01)
    assert d is not None and d.kind is EntryKind.VIEW
    assert d.proposal.members == ("a",) and d.proposal.generation == 5
    assert leader.quiet < leader.failure_grace  # so the drop did not wait for the failure grace


def test_a_failed_group_with_live_members_reforms_with_them_after_the_failure_grace() -> None:
    leader, _ = chores("alive")
    leader.decide(10.0)
    leader.group_failed(4, collective_failed("allreduce failed"))
    assert leader.decide(11.0 + leader.quiet + 0.01) is None
    d = leader.decide(11.0 + leader.failure_grace)
    assert d is not None and d.proposal.members == ("a", "b") and d.proposal.generation == 5


def test_a_dead_member_is_declared_then_dropped_from_the_view() -> None:
    leader, node = chores("alive")
    leader.decide(10.0)
    node.gossip["b"] = "dead"
    d = leader.decide(10.5)
    assert d is not None and d.kind is EntryKind.MEMBER_DEAD
    state = node.reads.state
    dead_b = Member("10.0.0.2:7100", "dead", 2, 7201)
    node.reads.state = ClusterState(members=MappingProxyType({**state.members, "b": dead_b}),
                                    voters=state.voters, view=state.view)
    assert leader.decide(10.6) is None
    d = leader.decide(10.6 + leader.quiet + 0.01)
    assert d is not None and d.kind is EntryKind.VIEW and d.proposal.members == ("a",)


def test_the_quiet_window_after_a_failure_counts_from_when_gossip_suspected_the_member() -> None:
    leader, node = chores("suspect")
    node.since = {"b": 10.95}
    assert leader.decide(10.96) is None  # kept while its group works
    leader.group_failed(4, collective_failed("connection reset by peer"))
    d = leader.decide(10.95 + leader.quiet + 0.001)
    assert d is not None and d.kind is EntryKind.VIEW and d.proposal.members == ("a",)


def test_a_member_gossip_holds_dead_leaves_the_view_before_its_status_is_committed() -> None:
    """Training waits on the view, not on the member record: the view goes first once the
    quiet window since gossip's verdict has passed, the committed status right after."""
    leader, node = chores("alive")
    leader.decide(10.0)
    node.gossip["b"], node.since = "dead", {"b": 10.2}
    d = leader.decide(10.2 + leader.quiet + 0.01)
    assert d is not None and d.kind is EntryKind.VIEW and d.proposal.members == ("a",)
    state = node.reads.state
    node.reads.state = ClusterState(members=state.members, voters=state.voters, view=View(5, ("a",), Address.parse("10.0.0.1:7101")))
    d = leader.decide(10.2 + leader.quiet + 0.02)
    assert d is not None and d.kind is EntryKind.MEMBER_DEAD and d.proposal.node_id == "b"


def test_a_new_leader_dates_a_drop_from_gossip_against_the_committed_view() -> None:
    """The member died with the old leader: gossip's verdict came before this node led, so the
    quiet window has passed at its first decision."""
    leader, node = chores("dead")
    node.since = {"b": 10.0}
    d = leader.decide(10.0 + leader.quiet + 0.01)
    assert d is not None and d.kind is EntryKind.VIEW and d.proposal.members == ("a",)


def test_a_new_leader_waits_the_quiet_window_for_a_newcomer() -> None:
    leader, node = chores("alive")
    members = {**node.reads.state.members, "c": Member("10.0.0.3:7100", "active", 3, 7301, True)}
    b_ready = Member("10.0.0.2:7100", "active", 2, 7201, True)
    node.reads.state = ClusterState(members=MappingProxyType({**members, "b": b_ready}), voters=("a", "b", "c"),
                                    view=node.reads.state.view)
    node.gossip["c"] = "alive"
    assert leader.decide(20.0) is None
    d = leader.decide(20.0 + leader.quiet + 0.01)
    assert d is not None and d.kind is EntryKind.VIEW and d.proposal.members == ("a", "b", "c")


def build_failed(node: str, start: int) -> FailureReport:
    return FailureReport(node, FailurePhase.BUILD, 0, f"RuntimeError: lock held (pid {4000 + start})", start)


def test_a_box_that_cannot_build_is_kept_out_while_the_group_trains_without_it() -> None:
    leader, node = chores("alive")
    state = node.reads.state
    b_not_built = Member("10.0.0.2:7100", "active", 2, 7201, False, "b" * 32)
    node.reads.state = ClusterState(members=MappingProxyType({**state.members, "b": b_not_built}),
                                    voters=state.voters, view=View(4, ("a",), Address.parse("10.0.0.1:7101")),
                                    uids=state.uids, epoch=1)
    for start in (1, 2, 3, 4):
        leader.group_failed(0, build_failed("b", start))
    assert leader.decide(30.0) is None, "no halt: a trains"
    assert set(leader.kept_out()) == {"b"} and "lock held" in leader.kept_out()["b"]


def test_the_job_halts_when_no_box_can_build_it() -> None:
    leader, node = chores("alive")
    state = node.reads.state
    unbuilt = {n: Member(m.addr, "active", m.joined_index, m.store_port, False, m.uid)
               for n, m in state.members.items()}
    node.reads.state = ClusterState(members=MappingProxyType(unbuilt), voters=state.voters, view=None,
                                    uids=state.uids, epoch=1)
    leader.box.ready = lambda: False  # the leader's own worker has not built the job either
    for start in (1, 2, 3):
        leader.group_failed(0, build_failed("b", start))
        leader.group_failed(0, build_failed("a", start))
    d = leader.decide(30.0)
    assert d is not None and d.kind is EntryKind.JOB and d.proposal.state is JobState.FAILED, d
    assert "no box can build it: a, b" in d.proposal.error


def test_a_step_failing_with_a_changing_figure_halts_the_job() -> None:
    leader, _ = chores("alive")
    for generation, free in ((4, 512), (5, 431), (6, 97)):
        leader.group_failed(generation, FailureReport("b", FailurePhase.TRAIN, 0, f"MemoryError: {free} MiB free",
                                                      generation))
    d = leader.decide(30.0)
    assert d is not None and d.kind is EntryKind.JOB and "3 times in a row" in d.proposal.error, d


def test_the_leader_s_record_names_its_site_and_its_next_view_names_every_member_s() -> None:
    leader, node = chores("alive")
    leader.box.site = lambda: ("lab", ())
    d = leader.decide(10.0)
    assert d is not None and d.proposal == MemberJoined("a", "10.0.0.1:7100", 7101, True, "a" * 32, "lab")
    state = node.reads.state
    members = {"a": replace(state.members["a"], site="lab"), "b": replace(state.members["b"], near=("a",))}
    node.reads.state = replace(state, members=MappingProxyType(members),
                               view=replace(state.view, sites=("lab", "lab")))
    assert leader.decide(11.0) is None  # the wanted members, first seen: the quiet window starts
    d = leader.decide(11.0 + leader.quiet + 0.01)
    assert d is not None and d.proposal.generation == 5 and d.proposal.sites == ("lab", "auto-b")
    assert "their sites changed" in d.reason


def test_the_leader_s_record_carries_its_speed_class_and_its_next_view_shares_by_the_members_classes() -> None:
    leader, node = chores("alive")
    leader.box.speed_class = lambda: 12
    d = leader.decide(10.0)
    assert d is not None and d.proposal == MemberJoined("a", "10.0.0.1:7100", 7101, True, "a" * 32, speed_class=12)
    state = node.reads.state
    members = {"a": replace(state.members["a"], speed_class=12), "b": replace(state.members["b"], speed_class=8)}
    node.reads.state = replace(state, members=MappingProxyType(members))
    assert leader.decide(11.0) is None  # the wanted members, first seen: the quiet window starts
    d = leader.decide(11.0 + leader.quiet + 0.01)  # a new leader takes the committed shares as old
    assert d is not None and d.proposal.generation == 5 and d.proposal.shares == (8, 4)
    assert "their shares changed" in d.reason
    node.reads.state = replace(node.reads.state, view=replace(state.view, generation=5, shares=(8, 4)))
    assert leader.decide(20.0) is None  # committed: the same shares make no new generation
    members = {**members, "b": replace(members["b"], speed_class=4)}  # b slowed down again
    node.reads.state = replace(node.reads.state, members=MappingProxyType(members))
    d = leader.decide(20.0 + RESHARE_EVERY - 1.0)
    assert d is None  # the shares of generation 5 stand a while first
    d = leader.decide(20.0 + RESHARE_EVERY)
    assert d is not None and d.proposal.generation == 6 and d.proposal.shares == (8, 2)
