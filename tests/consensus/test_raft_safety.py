"""Issue 14's scenarios against the real RaftNode: amnesia (a voter restarted on fresh storage
under its old node id), force sent to a healthy follower, committed entries from strangers, and a
follower acknowledging below its commit index. Each failed on the code before member identities,
the force guard and the checked acknowledgements (see the commit that added this file)."""

from __future__ import annotations

from raft_net import CFG, RaftNet, kv, uid_for

from dpeer.consensus import Peer, Proposed, Refused, Role, force_after
from dpeer.consensus.messages import AppendRequest, AppendResponse, VoteRequest
from dpeer.statemachine.entry import Entry, EntryKind


def committed(net: RaftNet, nid: str) -> dict[int, tuple[int, str, object]]:
    """index -> (term, kind, payload) of every committed entry node nid's storage holds."""
    st = net.storages[nid]
    return {e.index: (e.term, e.kind.value, e.payload) for e in st.entries(st.first_index, st.commit_index + 1)}


def disagreements(net: RaftNet) -> list[tuple[str, str, int]]:
    """(x, y, index) for every committed index two storages hold with different entries."""
    out, ids = [], sorted(net.nodes)
    for i, x in enumerate(ids):
        for y in ids[i + 1:]:
            cx, cy = committed(net, x), committed(net, y)
            out += [(x, y, k) for k in sorted(cx.keys() & cy.keys()) if cx[k] != cy[k]]
    return out


def led(net: RaftNet, nid: str) -> bool:
    """Whether node nid ever became leader (its Ready soft states say so)."""
    return any(rd.soft_state is not None and rd.soft_state.role is Role.LEADER for rd in net.readies[nid])


def test_a_voter_restarted_on_fresh_storage_never_votes_as_the_voter_it_replaced() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.cut |= {("a", "c"), ("c", "a")}
    net.propose("a", 1)  # (3, term 2) committed by a and b; c misses it
    assert net.nodes["a"].commit_index == 3 and net.storages["c"].last_index == 2
    net.wipe("b")  # b's disk is replaced: same node id, new store uid, only the founding config
    net.isolate("a")  # a dies
    net.run(10.0, ["b", "c"])
    assert not led(net, "b") and not led(net, "c")  # before: c led term 3 with b's vote, its noop at 3
    assert not disagreements(net)
    b = net.nodes["b"]
    assert not b.membership.is_voter("b", b.uid) and b.term == 1  # b never voted, nor campaigned
    assert not [m for _, m in net.sent("b", VoteRequest)]


def test_the_leader_replaces_a_member_that_lost_its_data_by_ordinary_changes() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.propose("a", 1)
    net.wipe("b")
    a = net.nodes["a"]
    a.observe(net.nodes["b"].identity)  # gossip brings b's new identity
    assert a.strangers() == {"b": net.uid("b")}
    net.isolate("c")
    net.propose("a", 2)
    assert a.commit_index == 3  # b's answers (under its new uid) count for nothing
    net.heal()
    net.heartbeat("a")
    assert isinstance(a.change_membership("remove", "b"), Proposed)
    net.heartbeat("a")
    assert isinstance(a.change_membership("add_learner", "b", net.uid("b")), Proposed)
    net.heartbeat("a")
    net.heartbeat("a")
    assert net.storages["b"].commit_index == a.commit_index and not disagreements(net)
    assert isinstance(a.change_membership("promote", "b"), Proposed)
    net.heartbeat("a")
    assert a.membership.is_voter("b", net.uid("b")) and a.strangers() == {}
    net.isolate("c")
    net.propose("a", 3)
    assert a.commit_index == a.log.last_index()  # the new b's acknowledgements count now
    assert not disagreements(net)


def test_a_wiped_voter_of_two_leaves_no_quorum_and_no_leader() -> None:
    """The liveness cousin: voters n0 and n1, n1 wiped. Safe, and stuck until an operator forces."""
    net = RaftNet(["n0", "n1"])
    net.elect("n0")
    net.propose("n0", 1)
    net.wipe("n1")
    net.run(10.0)
    assert net.leaders() == [] and net.nodes["n0"].commit_index == 3
    n0 = net.nodes["n0"]
    n0.observe(net.nodes["n1"].identity)
    assert n0.strangers() == {"n1": net.uid("n1")}
    net.advance(force_after(CFG))
    assert isinstance(n0.force_new_configuration(net.now, ["n0"], set(), 1.7e9), Proposed)
    net.deliver()
    assert net.leaders() == ["n0"] and n0.epoch == 2
    assert isinstance(n0.change_membership("add_learner", "n1", net.uid("n1")), Proposed)
    net.heartbeat("n0")
    net.heartbeat("n0")
    assert net.storages["n1"].commit_index == n0.commit_index and not disagreements(net)
    assert net.nodes["n1"].epoch == 2


def test_force_at_a_follower_of_a_healthy_cluster_is_refused() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.heartbeat("a")
    c = net.nodes["c"]
    res = c.force_new_configuration(net.now, ["c"], set(), 1.7e9)
    assert isinstance(res, Refused) and "a leader was known" in res.reason
    net.advance(force_after(CFG) + 1)  # the leader fell silent long enough, but a majority answers
    res = c.force_new_configuration(net.now, ["c"], {"a", "b"}, 1.7e9)
    assert isinstance(res, Refused) and "3 of 3 voters are reachable" in res.reason
    assert (c.epoch, c.term, c.membership.voters) == (1, 2, {"a", "b", "c"})
    net.propose("a", 1)
    net.heartbeat("a")
    assert net.leaders() == ["a"] and not disagreements(net)  # before: c led alone, 2 leaders


def test_force_is_refused_to_the_leader_a_wiped_node_and_for_voters_outside_the_configuration() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    later = net.now + force_after(CFG) + 1
    assert "leads" in net.nodes["a"].force_new_configuration(later, ["a"], set(), 1.0).reason
    net.wipe("c")
    assert "not a voter" in net.nodes["c"].force_new_configuration(later, ["c"], set(), 1.0).reason
    assert "are not" in net.nodes["b"].force_new_configuration(later, ["b", "x"], set(), 1.0).reason
    assert "among" in net.nodes["b"].force_new_configuration(later, ["a"], set(), 1.0).reason


def test_voters_of_the_old_epoch_are_refused_and_stop_campaigning() -> None:
    net = RaftNet(list("abc"))
    net.elect("a")
    net.propose("a", 1)
    net.isolate("b")
    net.isolate("c")  # b and c are "lost for good"; a forces itself alone
    while net.nodes["a"].role is Role.LEADER:
        net.heartbeat("a")
    net.advance(force_after(CFG))
    a = net.nodes["a"]
    assert isinstance(a.force_new_configuration(net.now, ["a"], set(), 1.7e9), Proposed)
    net.deliver()
    net.propose("a", 2)
    net.heal()  # b and c come back on their old disks: a refuses them, and its replies carry its epoch
    net.run(10.0)
    b, c = net.nodes["b"], net.nodes["c"]
    assert net.leaders() == ["a"] and a.old_epoch_peers == {"b": 1, "c": 1}
    assert b.newest_epoch > b.epoch and c.newest_epoch > c.epoch and not disagreements(net)  # superseded
    assert not led(net, "b") and not led(net, "c")  # they never elected each other


def test_committed_entries_from_a_stranger_or_above_the_senders_term_are_refused() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    b, c = net.nodes["b"], net.nodes["c"]
    forged = [Entry(2, 2, EntryKind.NOOP, {}), Entry(3, 99, EntryKind.KV_PUT, kv(99))]
    for sender, reason in [
        (Peer("x", uid_for("x"), 1), "not a member"),  # a stranger gossiping a higher commit index
        (Peer("c", uid_for("c", 1), 1), "not a member"),  # c's name, another store
        (Peer("c", net.uid("c"), 2), "epoch"),
        (c.identity, "above the sender's term"),
    ]:
        res = b.accept_committed(forged, 3, sender, c.term)
        assert not res.accepted and reason in res.reason, res
    net.propose("a", 1)
    net.heartbeat("a")
    assert not disagreements(net) and b.commit_index == 3  # before: b committed the forgery


def test_a_follower_never_acknowledges_an_entry_that_differs_from_one_it_committed() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.heartbeat("a")
    net.isolate("c")
    b_st = net.storages["b"]  # b's disk holds a committed entry a never wrote (a forgery, a bug)
    b_st.append([Entry(3, 99, EntryKind.KV_PUT, kv(99))])
    b_st.set_commit(3)
    net.restart("b")
    net.propose("a", 1)  # a's own (3, term 2)
    net.heartbeat("a")
    a = net.nodes["a"]
    assert a.commit_index == 2 and a.tracker.progress["b"].match < 3  # before: b's "match 3" counted
    assert net.nodes["b"].follower.diverged_at == 3
    assert not [m for _, m in net.sent("b", AppendResponse) if m.success and m.match_index >= 3]


def test_an_append_below_the_commit_index_is_acknowledged_only_as_far_as_it_was_checked() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    for i in range(3):
        net.propose("a", i)
    net.heartbeat("a")  # everyone committed 5
    a, b = net.nodes["a"], net.nodes["b"]
    stale = a.log.slice(2, 4, 1 << 20)  # a duplicate of an old append: prev 1, entries 2..3
    b.step(net.now, a.identity, AppendRequest(a.term, "a", 1, 1, tuple(stale), 3), net.uid("b"))
    net.flush("b")
    _, resp = net.sent("b", AppendResponse)[-1]
    assert resp.success and resp.match_index == 3  # not 5: only 1..3 were compared
    longer = a.log.slice(2, 6, 1 << 20)
    b.step(net.now, a.identity, AppendRequest(a.term, "a", 1, 1, tuple(longer), 5), net.uid("b"))
    net.flush("b")
    assert net.sent("b", AppendResponse)[-1][1].match_index == 5
