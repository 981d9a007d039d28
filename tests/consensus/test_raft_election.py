"""Elections step by step: votes, pre-vote, leader lease, check-quorum, durability of votes."""

from __future__ import annotations

from raft_net import RaftNet

from dpeer.consensus import Role
from dpeer.consensus.messages import VoteRequest, VoteResponse
from dpeer.statemachine.entry import EntryKind


def test_single_node_elects_itself_and_commits_its_noop() -> None:
    net = RaftNet(["a"])
    net.elect("a")
    a = net.nodes["a"]
    assert a.role is Role.LEADER and a.term == 2
    assert [e.kind for e in net.applied["a"]] == [EntryKind.CONFIG_CHANGE, EntryKind.NOOP]


def test_three_nodes_elect_one_leader_that_commits_a_noop_everywhere() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    assert net.leaders() == ["a"]
    assert {n.term for n in net.nodes.values()} == {2}
    assert all(n.leader == "a" for n in net.nodes.values())
    net.heartbeat("a")
    for nid in "abc":
        assert [(e.index, e.kind) for e in net.applied[nid]] == [
            (1, EntryKind.CONFIG_CHANGE), (2, EntryKind.NOOP)]


def test_a_vote_is_in_the_hard_state_of_the_same_ready_as_the_grant() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    grants = [(rd, m) for rd in net.readies["b"] for _, _, m in rd.messages
              if isinstance(m, VoteResponse) and m.granted and not m.pre_vote]
    assert len(grants) == 1
    rd, m = grants[0]
    assert rd.hard_state is not None and rd.hard_state.voted_for == "a"
    assert rd.hard_state.term == m.term == 2
    assert net.storages["b"].voted_for == "a"


def test_pre_vote_does_not_bump_the_term_of_an_isolated_node() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.isolate("c")
    for _ in range(5):
        net.elect("c")
    assert net.nodes["c"].term == 2 and net.nodes["c"].role is Role.PRE_CANDIDATE
    assert not net.sent("c", VoteRequest)[-1][1].term > 3


def test_a_partitioned_node_rejoining_does_not_disrupt_the_leader() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.isolate("c")
    for _ in range(3):
        net.elect("c")
    net.nodes["c"].election.deadline = net.now  # c's timer fires right as the partition heals
    net.heal()
    net.run(10.0)  # c's pre-votes meet followers inside the leader's lease
    assert net.leaders() == ["a"] and net.nodes["a"].term == 2
    assert net.nodes["c"].leader == "a" and net.nodes["c"].role is Role.FOLLOWER
    rejected = [m for _, m in net.sent("c", VoteRequest)]
    assert rejected and all(m.pre_vote for m in rejected)


def test_followers_reject_pre_votes_while_they_hear_from_a_leader() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.heartbeat("a")
    b = net.nodes["b"]
    b.step(net.now, net.nodes["c"].identity, VoteRequest(3, "c", 99, 2, pre_vote=True), net.uid("b"))
    net.flush("b")
    _, resp = net.sent("b", VoteResponse)[-1]
    assert not resp.granted and resp.reason == "leader_lease"
    net.advance(net.cfg.election_timeout_min + 0.01)
    b.step(net.now, net.nodes["c"].identity, VoteRequest(3, "c", 99, 2, pre_vote=True), net.uid("b"))
    net.flush("b")
    _, resp = net.sent("b", VoteResponse)[-1]
    assert resp.granted and resp.term == 3 and b.term == 2  # a pre-vote changes nothing


def test_a_candidate_with_a_stale_log_is_refused() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.isolate("c")
    net.propose("a", 1)
    net.heal()
    net.advance(10)
    net.isolate("a")
    net.elect("c")
    assert net.nodes["c"].role is not Role.LEADER
    reasons = [m.reason for _, m in net.sent("b", VoteResponse) if not m.granted]
    assert "log_behind" in reasons
    net.elect("b")
    assert net.nodes["b"].role is Role.LEADER


def test_check_quorum_makes_an_isolated_leader_step_down() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.isolate("a")
    t0 = net.now
    for _ in range(40):
        net.tick("a")
        if net.nodes["a"].role is not Role.LEADER:
            break
    assert net.nodes["a"].role is Role.FOLLOWER
    assert net.now - t0 <= 2 * net.cfg.election_timeout_min + 1e-9


def test_a_leader_hearing_its_quorum_stays() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    for _ in range(40):
        net.heartbeat("a")
    assert net.leaders() == ["a"] and net.nodes["a"].term == 2


def test_a_stale_leader_learns_the_new_term_from_any_reply() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.isolate("a")
    net.advance(10)
    net.elect("b")
    assert net.nodes["b"].role is Role.LEADER and net.nodes["b"].term == 3
    net.heal()
    net.nodes["a"].lead.heartbeat_due = net.now  # a still believes it leads; make it beat now
    net.heartbeat("a")
    assert net.nodes["a"].role is Role.FOLLOWER and net.nodes["a"].term == 3


def test_split_vote_resolves_after_another_timeout() -> None:
    net = RaftNet(["a", "b", "c", "d"])
    net.isolate("a")
    net.isolate("b")
    net.tick("a")
    net.tick("b")
    net.heal()
    net.deliver()
    assert len(net.leaders()) <= 1
    for _ in range(10):
        if net.leaders():
            break
        net.elect("c")
    assert len(net.leaders()) == 1


def test_restart_keeps_term_vote_and_log() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.propose("a", 1)
    net.heartbeat("a")
    net.restart("b")
    b = net.nodes["b"]
    assert (b.term, b.voted_for, b.log.last_index(), b.commit_index) == (2, "a", 3, 3)
    assert b.membership.voters == {"a", "b", "c"}
