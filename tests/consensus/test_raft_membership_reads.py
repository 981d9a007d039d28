"""Voting configuration changes, ReadIndex, committed-entry resync and forced recovery, step by step."""

from __future__ import annotations

from dataclasses import replace

from raft_net import CFG, RaftNet, entry

from dpeer.consensus import NotLeader, Proposed, RaftNode, ReadRequested, Refused, Role, force_after
from dpeer.statemachine.entry import EntryKind


def conf(node: RaftNode) -> tuple[set[str], set[str]]:
    """(voters, learners) of a node's configuration in force."""
    return set(node.membership.voters), set(node.membership.learners)


def reads(net: RaftNet, nid: str) -> list[tuple[int, int]]:
    return [(r.request_id, r.index) for rd in net.readies[nid] for r in rd.read_states]


def test_a_learner_joins_catches_up_and_is_promoted_one_change_at_a_time() -> None:
    net = RaftNet(["a"], joiners=["b", "c"], cfg=replace(CFG, max_voters=2))
    net.elect("a")
    a = net.nodes["a"]
    for i in range(3):
        net.propose("a", i)
    assert isinstance(a.change_membership("add_learner", "b", net.uid("b")), Proposed)
    assert isinstance(a.change_membership("add_learner", "c", net.uid("c")), Refused)  # one pending at a time
    net.deliver()
    net.heartbeat("a")
    assert conf(net.nodes["b"]) == ({"a"}, {"b"}) and net.nodes["b"].membership.uid_of("b") == net.uid("b")
    assert net.storages["b"].last_index == a.log.last_index()
    assert isinstance(a.change_membership("promote", "b"), Proposed)
    net.heartbeat("a")
    assert conf(a) == ({"a", "b"}, set()) and a.commit_index == a.log.last_index()
    refused = a.change_membership("add_voter", "c", net.uid("c"))
    assert isinstance(refused, Refused) and "cap" in refused.reason
    assert isinstance(a.change_membership("add_learner", "c", net.uid("c")), Proposed)
    net.heartbeat("a")
    assert conf(net.nodes["c"]) == ({"a", "b"}, {"c"})
    net.isolate("b")
    net.propose("a", 9)
    assert a.commit_index < a.log.last_index()  # two voters: a alone is no majority


def test_removing_a_voter_shrinks_the_quorum_and_a_removed_leader_steps_down() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    a = net.nodes["a"]
    assert isinstance(a.change_membership("remove", "c"), Proposed)
    net.heartbeat("a")
    assert net.nodes["b"].membership.voters == {"a", "b"}
    assert isinstance(a.change_membership("remove", "a"), Proposed)
    net.heartbeat("a")
    assert a.role is Role.FOLLOWER and net.nodes["b"].membership.voters == {"b"}
    net.elect("b")
    assert net.leaders() == ["b"]
    net.tick("a")
    assert net.leaders() == ["b"]  # a is no voter any more: it never campaigns


def test_removing_a_voter_is_refused_when_the_voters_left_hold_no_live_quorum() -> None:
    """Voters a, b, c with c silent: removing b would leave {a, c}, which can never commit while
    c stays away (seed 623 of the house: a leave while another voter was wiped). The removal is
    refused with the silent voters named; removing the silent c itself goes through."""
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.isolate("c")
    net.run(5.0, ["a", "b"])
    a = net.nodes["a"]
    assert a.role is Role.LEADER
    refused = a.change_membership("remove", "b")
    assert isinstance(refused, Refused) and "no live quorum" in refused.reason and "['c']" in refused.reason
    assert isinstance(a.change_membership("remove", "c"), Proposed)
    net.heartbeat("a")
    assert conf(net.nodes["b"]) == ({"a", "b"}, set())


def test_read_index_confirms_leadership_with_a_heartbeat_round() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.propose("a", 1)
    a = net.nodes["a"]
    assert net.nodes["b"].read_index() == NotLeader("a")
    res = a.read_index()
    assert isinstance(res, ReadRequested)
    net.deliver()
    assert reads(net, "a") == [(res.request_id, 3)]
    net.isolate("a")
    res2 = a.read_index()
    net.deliver()
    assert all(rid != res2.request_id for rid, _ in reads(net, "a"))  # no quorum, no answer


def test_read_index_waits_for_the_first_commit_of_the_term() -> None:
    net = RaftNet(["a", "b", "c"])
    net.tick("a")
    net.deliver(limit=7)  # pre-votes and votes only: a leads but its noop is not committed
    a = net.nodes["a"]
    assert a.role is Role.LEADER and a.commit_index == 1
    res = a.read_index()
    net.flush("a")
    assert reads(net, "a") == []
    net.deliver()
    assert reads(net, "a") == [(res.request_id, 2)]


def test_accept_committed_appends_consistent_committed_entries_from_any_peer() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.isolate("c")
    for i in range(5):
        net.propose("a", i)
    net.heartbeat("a")
    b_st, c = net.storages["b"], net.nodes["c"]
    batch = b_st.entries(c.commit_index, b_st.commit_index + 1)
    b = net.nodes["b"]
    res = c.accept_committed(batch, b_st.commit_index, b.identity, b.term)
    assert res.accepted and res.commit == b_st.commit_index == 7
    net.flush("c")
    assert [e.index for e in net.applied["c"]] == list(range(1, 8))
    assert c.accept_committed(batch, 7, b.identity, b.term).accepted  # idempotent


def test_accept_committed_truncates_only_uncommitted_conflicts() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("c")
    net.isolate("c")
    net.propose("c", 0)  # (3, term 2) uncommitted on c
    while net.nodes["c"].role is Role.LEADER:
        net.tick("c")
    net.advance(5)
    net.elect("a")
    net.propose("a", 1)
    net.heartbeat("a")
    b_st, c = net.storages["b"], net.nodes["c"]
    b = net.nodes["b"]
    res = c.accept_committed(b_st.entries(2, b_st.commit_index + 1), b_st.commit_index, b.identity, b.term)
    assert res.accepted and c.log.term(3) == 3 and c.commit_index == 4


def test_accept_committed_rejects_gaps_uncommitted_and_conflicting_batches() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    for i in range(3):
        net.propose("a", i)
    net.heartbeat("a")
    b, c = net.nodes["b"], net.nodes["c"].identity
    kv = {"key": "x", "value": "y"}
    gap = [entry(9, 2, EntryKind.KV_PUT, **kv)]
    assert "overlap" in b.accept_committed(gap, 9, c, 7).reason
    changed = [entry(4, 7, EntryKind.KV_PUT, **kv), entry(5, 7, EntryKind.KV_PUT, **kv)]
    assert "conflicts" in b.accept_committed(changed, 5, c, 7).reason
    ahead = [entry(5, 2, EntryKind.KV_PUT, **kv), entry(6, 2, EntryKind.KV_PUT, **kv)]
    assert "beyond" in b.accept_committed(ahead, 5, c, 7).reason
    assert net.nodes["a"].accept_committed(ahead, 6, c, 7).reason == "leader"
    assert b.commit_index == 5


def test_force_new_configuration_restores_progress_after_losing_a_majority() -> None:
    net = RaftNet(list("abcde"))
    net.elect("a")
    net.propose("a", 1)
    for nid in "cde":
        net.isolate(nid)
    net.cut -= {("a", "b"), ("b", "a")}
    net.propose("a", 2)
    assert net.nodes["a"].commit_index == 3  # 2 of 5 voters: stuck
    while net.nodes["a"].role is Role.LEADER:
        net.heartbeat("a")  # check-quorum: the leader of a lost majority steps down
    net.advance(force_after(CFG))
    b = net.nodes["b"]
    assert isinstance(b.force_new_configuration(net.now, ["a", "b"], {"a"}, 1.7e9), Proposed)
    net.deliver()
    assert b.role is Role.LEADER and b.membership.voters == {"a", "b"}
    assert (b.epoch, b.membership.forced_at, net.nodes["a"].epoch) == (2, 1.7e9, 2)
    assert isinstance(b.propose(EntryKind.KV_PUT, {"key": "k", "value": "v"}), Proposed)
    net.heartbeat("b")
    assert net.nodes["a"].commit_index == b.commit_index == b.log.last_index()
