"""Replication step by step: log matching, conflict truncation, Figure 8, learners, snapshots."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from raft_net import CFG, RaftNet

from dpeer.consensus import Proposed, Refused, Role
from dpeer.consensus.messages import AppendRequest, AppendResponse, RaftHeartbeat, SnapshotRequest, VoteRequest
from dpeer.statemachine.entry import EntryKind
from dpeer.statemachine.state import ClusterState, apply_many


def logs(net: RaftNet, nid: str) -> list[tuple[int, int]]:
    """(index, term) of every stored entry of node nid."""
    st = net.storages[nid]
    return [(e.index, e.term) for e in st.entries(st.first_index, st.last_index + 1)]


def test_proposals_replicate_and_commit_in_order_on_every_node() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    results = [net.propose("a", i) for i in range(5)]
    net.heartbeat("a")
    assert [r.index for r in results] == [3, 4, 5, 6, 7]
    for nid in "abc":
        assert [e.payload.get("key") for e in net.applied[nid][2:]] == [f"k{i}" for i in range(5)]
    assert net.nodes["b"].propose(EntryKind.KV_PUT, {"key": "x", "value": "y"}).leader == "a"


def test_a_follower_drops_its_conflicting_suffix_using_few_round_trips() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("b")
    net.isolate("b")
    for i in range(30):
        net.propose("b", i)  # term-2 entries only b holds
    while net.nodes["b"].role is Role.LEADER:
        net.tick("b")  # check-quorum: the isolated leader steps down
    net.advance(5)
    net.elect("a")
    for i in range(40):
        net.propose("a", 100 + i)
    net.isolate("a")
    net.cut -= {("b", "c"), ("c", "b")}
    net.advance(5)
    net.elect("c")  # c's progress for b starts at its last index + 1 = 44
    assert net.nodes["c"].term == 4 and net.nodes["c"].role is Role.LEADER
    net.heartbeat("c")
    net.heal()
    net.heartbeat("c")
    assert logs(net, "b") == logs(net, "a") == logs(net, "c")
    assert net.nodes["b"].role is Role.FOLLOWER and net.nodes["b"].term == 4
    rejects = [m for d, m in net.sent("b", AppendResponse) if d == "c" and not m.success]
    assert len(rejects) == 1  # fast backoff skips b's whole term-2 run in one round trip
    assert (rejects[0].reject_hint, rejects[0].reject_term) == (32, 2)


def test_figure8_an_old_term_entry_is_not_committed_by_counting_replicas() -> None:
    net = RaftNet(list("abcde"), cfg=replace(CFG, max_entries_per_msg=1))
    net.elect("a")
    net.heartbeat("a")
    net.drop = lambda s, d, m: s == "a" and d != "b" and isinstance(m, AppendRequest)
    net.propose("a", 1)  # (3, term 2) on a and b only
    net.isolate("a")
    net.isolate("b")
    while net.nodes["a"].role is Role.LEADER:
        net.tick("a")
    net.drop = lambda s, d, m: s == "e" and isinstance(m, AppendRequest)
    net.advance(3)
    net.elect("e")  # term 3 with c, d; its noop (3, term 3) stays on e
    assert net.nodes["e"].role is Role.LEADER and logs(net, "e")[-1] == (3, 3)
    net.heal()
    net.isolate("e")
    while net.nodes["e"].role is Role.LEADER:
        net.tick("e")  # check-quorum: e steps down, its followers never answered
    net.drop = lambda s, d, m: False
    net.rewrite = lambda s, d, m: replace(m, entries=tuple(
        x for x in m.entries if x.term < 4)) if isinstance(m, AppendRequest) else m
    net.advance(3)
    while net.nodes["a"].role is not Role.LEADER:
        net.elect("a")
    net.heartbeat("a")
    a = net.nodes["a"]
    assert a.term == 4 and a.tracker.progress["c"].match == 3  # (3, term 2) on a, b, c ...
    assert a.commit_index == 2  # ... yet not committed: no term-4 entry reached a majority
    net.heal()
    net.isolate("a")
    net.rewrite = lambda s, d, m: m
    net.advance(3)
    while net.nodes["a"].role is Role.LEADER:
        net.tick("a")
    for _ in range(6):
        if net.nodes["e"].role is Role.LEADER:
            break
        net.elect("e")
    assert net.nodes["e"].role is Role.LEADER
    net.heartbeat("e")
    assert logs(net, "b")[2] == logs(net, "c")[2] == (3, 3)  # the old entry was safely replaced
    assert all(e.index <= 2 or e.term != 2 for e in net.applied["b"])


def test_learners_replicate_but_do_not_count_or_campaign() -> None:
    net = RaftNet(["a", "b", "c", "l"], voters=["a", "b", "c"], learners=["l"])
    net.elect("a")
    net.isolate("b")
    net.isolate("c")
    net.cut -= {("a", "l"), ("l", "a")}
    net.propose("a", 1)
    net.heartbeat("a")
    assert net.storages["l"].last_index == 3 and net.nodes["a"].commit_index == 2
    for _ in range(3):
        net.tick("l")
    assert not net.sent("l", VoteRequest) and net.nodes["l"].role is Role.FOLLOWER
    net.heal()
    net.heartbeat("a")
    assert net.nodes["a"].commit_index == 3 and net.nodes["l"].commit_index == 3


def test_learners_are_beaten_at_their_own_slower_interval() -> None:
    cfg = replace(CFG, heartbeat_interval=0.125, learner_heartbeat_interval=0.5)
    net = RaftNet(["a", "b", "c", "l"], voters=["a", "b", "c"], learners=["l"], cfg=cfg)
    net.elect("a")
    net.run(2.0, nodes=["a"])
    beats = Counter(dst for dst, _ in net.sent("a", RaftHeartbeat))
    assert beats["b"] == beats["c"] >= 15
    assert 3 <= beats["l"] <= 5 and abs(beats["b"] - 4 * beats["l"]) <= 4
    # a new entry and then its commit reach the learner at once, not at its next beat
    net.propose("a", 1)
    assert net.nodes["l"].commit_index == net.nodes["a"].commit_index == net.storages["l"].last_index
    # a ReadIndex round beats the voters only: learners do not confirm leadership
    before = len(net.sent("a", RaftHeartbeat))
    net.nodes["a"].read_index()
    net.deliver()
    assert sorted(dst for dst, _ in net.sent("a", RaftHeartbeat)[before:]) == ["b", "c"]
    # voters' leases stay fresh, the learner never campaigns and keeps its leader
    net.run(3.0)
    assert net.leaders() == ["a"] and net.nodes["l"].leader == "a" and not net.sent("l", VoteRequest)


def test_a_learner_heartbeat_interval_below_the_heartbeat_is_refused() -> None:
    with pytest.raises(ValueError, match="learner_heartbeat_interval"):
        replace(CFG, learner_heartbeat_interval=0.05)


def test_a_lagging_follower_catches_up_from_a_snapshot_then_the_tail() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.isolate("c")
    for i in range(20):
        net.propose("a", i)
    net.heartbeat("a")
    a_st = net.storages["a"]
    a_st.compact(a_st.last_applied, b"state@22", net.nodes["a"].membership)
    net.propose("a", 99)
    net.heal()
    net.heartbeat("a")
    net.heartbeat("a")
    c_st = net.storages["c"]
    assert net.sent("a", SnapshotRequest)
    assert c_st.snapshot().index == 22 and c_st.snapshot().data == b"state@22"
    assert c_st.last_index == a_st.last_index == 23 and c_st.commit_index == 23
    assert [e.index for e in net.applied["c"]] == [1, 2, 23]
    assert net.nodes["c"].membership == net.nodes["a"].membership
    net.restart("c")
    assert net.nodes["c"].log.last_index() == 23


def test_a_restarted_leader_keeps_only_what_it_persisted() -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    net.nodes["a"].propose(EntryKind.KV_PUT, {"key": "lost", "value": "1"})  # never flushed
    net.restart("a")
    assert net.storages["a"].last_index == 2
    net.advance(5)
    net.elect("b")
    net.heartbeat("b")
    assert all(e.payload.get("key") != "lost" for e in net.applied["b"])


def test_the_core_appends_a_payload_it_cannot_read_and_the_state_machine_refuses_it() -> None:
    """The core never reads a payload: what is well formed is the state machine's to say."""
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    res = net.nodes["a"].propose(EntryKind.KV_PUT, {"not": "a kv pair"})
    assert isinstance(res, Proposed)
    net.heartbeat("a")
    (entry,) = [e for e in net.applied["b"] if e.index == res.index]
    assert entry.payload == {"not": "a kv pair"}
    _, results = apply_many(ClusterState(applied_index=res.index - 1), [entry])
    assert not results[0].accepted and results[0].reason.startswith("malformed payload (kv_put: ")


@pytest.mark.parametrize("kind,payload", [
    ("config_change", {}),  # a kind by its string: never past the config-change guard
    (EntryKind.KV_PUT, {"key": object()}),  # nothing msgpack can store
    (EntryKind.KV_PUT, {1: "int key"}),
    (EntryKind.KV_PUT, {"n": 2**70}),
])
def test_a_proposal_the_log_cannot_hold_is_refused_and_nothing_is_appended(kind, payload) -> None:
    net = RaftNet(["a", "b", "c"])
    net.elect("a")
    last = net.nodes["a"].log.last_index()
    assert isinstance(net.nodes["a"].propose(kind, payload), Refused)
    assert net.nodes["a"].log.last_index() == last
