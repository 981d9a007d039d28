"""Idle leaders, step by step: slow beats once nothing is in flight, a long lease on followers,
any entry ending the idle period, check-quorum on the idle window, and leader_lost() as the
failure detector's shortcut to an election."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from raft_net import CFG, RaftNet, kv

from dpeer.consensus import Role
from dpeer.consensus.messages import RaftHeartbeat, VoteRequest, VoteResponse
from dpeer.consensus.replication import IDLE_AFTER_BEATS
from dpeer.consensus.succession import LEASE_RETRY
from dpeer.statemachine.entry import EntryKind

IDLE = replace(CFG, learner_heartbeat_interval=0.5, idle_heartbeat_interval=0.5,
               idle_learner_heartbeat_interval=2.0, idle_election_timeout=4.0)


def _idle_net(voters: int = 3) -> RaftNet:
    names = list("abcde"[:voters])
    net = RaftNet([*names, "l"], voters=names, learners=["l"], cfg=IDLE)
    net.elect("a")
    net.run(IDLE.election_timeout_max + 0.5, nodes=["a"])
    return net


def _beats_in(net: RaftNet, seconds: float) -> tuple[Counter, list[RaftHeartbeat]]:
    before = len(net.sent("a", RaftHeartbeat))
    net.run(seconds, nodes=["a"])
    new = net.sent("a", RaftHeartbeat)[before:]
    return Counter(dst for dst, _ in new), [m for _, m in new]


def test_a_leader_with_nothing_in_flight_beats_slowly_and_marks_its_beats_idle() -> None:
    net = _idle_net()
    beats, msgs = _beats_in(net, 10.0)
    assert beats["b"] == beats["c"] == 20 and beats["l"] == 5
    assert all(m.idle for m in msgs)
    # followers hold the lease and wait out the idle timeout: nobody campaigns
    net.run(10.0)
    assert net.leaders() == ["a"] and not net.sent("b", VoteRequest) and not net.sent("c", VoteRequest)


def test_an_idle_leader_beats_a_learner_that_lacks_entries_with_the_voters() -> None:
    net = _idle_net()
    net.cut |= {("a", "l")}
    net.propose("a", 1)
    net.run(IDLE.election_timeout_max + 0.5, nodes=["a", "b", "c"])
    assert net.nodes["l"].commit_index < net.nodes["a"].commit_index
    # run until the learners' own idle beat has just gone (lost on the cut)
    assert any(_beats_in(net, 0.05)[0]["l"] for _ in range(60))
    net.cut.clear()
    # the next voters' beat reaches the learner too; its answer shows the gap, the leader fills it
    beats, msgs = _beats_in(net, IDLE.idle_heartbeat_interval)
    assert all(m.idle for m in msgs) and beats["l"] == beats["b"] == 1
    assert net.nodes["l"].commit_index == net.nodes["a"].commit_index
    # caught up, it is beaten at the learners' idle pace again
    beats, _ = _beats_in(net, 4.0)
    assert beats["l"] <= 2 and beats["b"] == 8


def test_a_new_leader_beats_at_the_busy_interval_without_the_idle_mark() -> None:
    net = RaftNet(["a", "b", "c"], cfg=IDLE)
    net.elect("a")
    beats, msgs = _beats_in(net, IDLE_AFTER_BEATS * IDLE.heartbeat_interval - 0.01)
    assert beats["b"] >= IDLE_AFTER_BEATS - 1 and not any(m.idle for m in msgs)


def test_a_new_entry_ends_the_idle_period_at_once() -> None:
    net = _idle_net()
    net.propose("a", 1)
    assert all(net.nodes[n].commit_index == net.nodes["a"].commit_index for n in "bcl")
    busy = IDLE_AFTER_BEATS * IDLE.heartbeat_interval
    beats, msgs = _beats_in(net, busy - 0.01)
    assert beats["b"] >= IDLE_AFTER_BEATS - 1 and not any(m.idle for m in msgs)
    # two beats after the last activity it is idle again
    beats, msgs = _beats_in(net, 4.0)
    assert msgs[-1].idle and beats["b"] <= 4.0 / IDLE.idle_heartbeat_interval + IDLE_AFTER_BEATS


def test_a_leader_appending_every_beat_stays_busy() -> None:
    net = _idle_net()
    before = len(net.sent("a", RaftHeartbeat))
    for i in range(5):
        net.propose("a", i)
        net.run(IDLE.heartbeat_interval, nodes=["a"])
    msgs = [m for dst, m in net.sent("a", RaftHeartbeat)[before:] if dst == "b"]
    assert len(msgs) >= 4 and not any(m.idle for m in msgs)


def test_a_voter_that_lags_keeps_the_leader_busy() -> None:
    net = RaftNet(["a", "b", "c"], cfg=IDLE)
    net.elect("a")
    net.cut |= {("a", "c")}
    net.propose("a", 1)
    net.run(3.0, nodes=["a"])
    assert not any(m.idle for _, m in net.sent("a", RaftHeartbeat)[-3:])


def test_an_idle_follower_keeps_the_lease_against_a_disruptive_pre_vote() -> None:
    net = _idle_net()
    node = net.nodes["b"]
    assert node.election.deadline - net.now >= IDLE.idle_election_timeout - IDLE.idle_heartbeat_interval
    net.advance(2.0)  # past the busy lease, inside the idle one
    net.nodes["c"].tick(net.nodes["c"].next_deadline())  # c's timer fires early (a partition)
    net.nodes["c"].election.campaign(pre_vote=True)
    net.deliver()
    refusals = [m for _, m in net.sent("b", VoteResponse)]
    assert refusals and not refusals[-1].granted and refusals[-1].reason == "leader_lease"
    assert net.leaders() == ["a"]


def test_leader_lost_makes_the_first_successor_campaign_at_once_and_the_next_a_slot_later() -> None:
    net = _idle_net()
    net.isolate("a")
    slot = IDLE.election_timeout_min / 2
    for n, place in (("b", 0), ("c", 1)):
        net.nodes[n].leader_lost(net.now, "a")
        wait = net.nodes[n].next_deadline() - net.now
        assert place * slot - 1e-9 <= wait <= place * slot + 1e-9
    net.run(slot / 4 + 0.05, nodes=["b", "c"])
    assert [n for n in "bc" if net.nodes[n].role is Role.LEADER] == ["b"]


def test_a_pre_vote_refused_for_a_lease_the_voter_still_holds_is_asked_again_soon() -> None:
    net = _idle_net()
    net.isolate("a")
    net.nodes["b"].leader_lost(net.now, "a")  # b's detector saw it first; c still holds a's lease
    net.run(0.001, nodes=["b", "c"])
    refused = [m for _, m in net.sent("c", VoteResponse)]
    assert refused and refused[-1].reason == "leader_lease" and net.nodes["b"].role is not Role.LEADER
    first_retry = IDLE.heartbeat_interval * LEASE_RETRY
    assert net.nodes["b"].next_deadline() - net.now <= first_retry + 1e-9
    net.nodes["c"].leader_lost(net.now, "a")  # c's detector catches up
    net.run(first_retry + 0.01, nodes=["b", "c"])
    assert net.nodes["b"].role is Role.LEADER


def test_lease_retries_double_and_end_once_every_lease_has_run_out() -> None:
    net = _idle_net()
    net.cut |= {("a", "b"), ("b", "a")}  # b cannot hear a; c still does and keeps refusing
    net.nodes["b"].leader_lost(net.now, "a")
    start, asked = net.now, []
    while net.now - start < 1.5 * IDLE.election_timeout_min:  # bounded: each turn moves the clock
        before = len(net.sent("b", VoteRequest))
        net.run(0.001, nodes=["b", "c"])
        if len(net.sent("b", VoteRequest)) > before:
            asked.append(net.now)
    gaps = [round(b - a, 3) for a, b in zip(asked, asked[1:])]
    assert len(asked) >= 4 and all(g2 >= 1.9 * g1 for g1, g2 in zip(gaps, gaps[1:])), gaps
    assert asked[-1] - start <= IDLE.election_timeout_min + 0.001  # then the usual election timer
    assert net.leaders() == ["a"]


def _pre_vote_times(net: RaftNet, nid: str, seconds: float, nodes: list[str]) -> list[float]:
    """When node nid sent a pre-vote round, stepping the clock 1 ms at a time for `seconds`."""
    start, asked = net.now, []
    while net.now - start < seconds:  # bounded: each turn moves the clock
        before = len(net.sent(nid, VoteRequest))
        net.run(0.001, nodes=nodes)
        if len(net.sent(nid, VoteRequest)) > before:
            asked.append(round(net.now - start, 3))
    return asked


def test_the_retry_wait_doubles_per_round_however_many_voters_refused() -> None:
    schedules = []
    for voters in (3, 5):
        net = _idle_net(voters)
        names = list("abcde"[:voters])
        net.cut |= {("a", "b"), ("b", "a")}  # the others still hear a and refuse on its lease
        net.nodes["b"].leader_lost(net.now, "a")
        schedules.append(_pre_vote_times(net, "b", IDLE.election_timeout_min, names[1:]))
    assert schedules[0] == schedules[1] and len(schedules[0]) >= 4, schedules


def test_a_late_refusal_from_an_earlier_round_does_not_hide_a_grant() -> None:
    net = RaftNet(list("abcde"), cfg=IDLE)
    net.elect("a")
    net.run(IDLE.election_timeout_max + 0.5, nodes=["a"])
    net.isolate("a")
    b = net.nodes["b"]
    b.leader_lost(net.now, "a")
    net.tick("b")  # round 1: c, d and e still hold a's lease and refuse
    held = []

    def deliver(hold: bool) -> None:
        for nid in net.nodes:
            net.flush(nid)
        while net.queue:
            item = net.queue.pop(0)
            sender, dst, uid, msg = item
            if (sender.node_id, dst) in net.cut:
                continue
            if hold and sender.node_id == "d" and dst == "b" and isinstance(msg, VoteResponse):
                held.append(item)  # d's refusal of round 1 is slow on the wire
                continue
            net.nodes[dst].step(net.now, sender, msg, uid)
            net.flush(dst)

    deliver(hold=True)
    assert b.role is Role.PRE_CANDIDATE and len(held) == 1  # two refusals of five: the round goes on
    for n in "cd":
        net.nodes[n].leader_lost(net.now, "a")  # their detectors catch up; e's not yet
    net.tick("b")  # round 2, the retry, in the same term
    net.queue.insert(0, held.pop())  # round 1's late refusal from d lands before round 2's answers
    deliver(hold=False)
    assert b.role is Role.LEADER  # b, c and d granted round 2: a quorum of five


def test_the_lost_leaders_own_refusal_ends_the_retries() -> None:
    net = _idle_net()
    net.nodes["b"].leader_lost(net.now, "a")  # a wrong verdict: a is alive and answers
    net.run(IDLE.election_timeout_min, nodes=["a", "b", "c"])
    assert len([m for _, m in net.sent("b", VoteRequest) if m.pre_vote]) == 2  # one round, to a and c
    assert net.leaders() == ["a"]


def test_the_next_successor_wins_when_the_first_is_dead_too() -> None:
    net = _idle_net(5)
    net.isolate("a")
    net.isolate("b")
    for n in "cde":
        net.nodes[n].leader_lost(net.now, "a")
    net.run(1.25 * IDLE.election_timeout_min / 2 + 0.05, nodes=["c", "d", "e"])
    assert [n for n in "cde" if net.nodes[n].role is Role.LEADER] == ["c"]


def test_leader_lost_for_another_node_or_on_the_leader_changes_nothing() -> None:
    net = _idle_net()
    deadline = net.nodes["b"].next_deadline()
    net.nodes["b"].leader_lost(net.now, "c")
    net.nodes["a"].leader_lost(net.now, "a")
    assert net.nodes["b"].next_deadline() == deadline and net.leaders() == ["a"]


def test_a_wrong_leader_lost_verdict_costs_one_refused_pre_vote_and_no_new_term() -> None:
    net = _idle_net()
    term = net.nodes["a"].term
    net.nodes["b"].leader_lost(net.now, "a")
    net.run(IDLE.election_timeout_min, nodes=["b"])
    assert net.sent("b", VoteRequest) and all(m.pre_vote for _, m in net.sent("b", VoteRequest))
    assert net.nodes["b"].leader == "a"  # a lost pre-vote keeps the leader it knew
    net.run(2.0)
    assert net.leaders() == ["a"] and net.nodes["a"].term == term and net.nodes["b"].leader == "a"


def test_an_idle_leader_cut_off_from_its_voters_steps_down_within_two_idle_windows() -> None:
    net = _idle_net()
    net.isolate("a")
    net.run(2 * IDLE.idle_election_timeout + 0.1, nodes=["a"])
    assert net.nodes["a"].role is not Role.LEADER


def test_an_idle_leader_told_a_majority_died_steps_down_within_a_busy_window() -> None:
    net = _idle_net()
    net.cut |= {("a", "b"), ("b", "a"), ("a", "c"), ("c", "a")}
    for dead in ("b", "c"):
        net.nodes["a"].leader_lost(net.now, dead)
    net.run(IDLE.election_timeout_min + 0.05, nodes=["a"])
    assert net.nodes["a"].role is not Role.LEADER


def test_a_wrong_verdict_about_a_voter_costs_an_idle_leader_nothing() -> None:
    net = _idle_net()
    term = net.nodes["a"].term
    net.nodes["a"].leader_lost(net.now, "b")
    net.run(2 * IDLE.election_timeout_min)
    assert net.leaders() == ["a"] and net.nodes["a"].term == term


def test_an_idle_leader_answered_by_its_voters_keeps_leading() -> None:
    net = _idle_net()
    net.run(3 * IDLE.idle_election_timeout)
    assert net.leaders() == ["a"]


@pytest.mark.parametrize("change, match", [
    ({"idle_heartbeat_interval": 0.05}, "idle_heartbeat_interval"),
    ({"idle_heartbeat_interval": 0.0}, "need idle_heartbeat_interval"),
    ({"idle_learner_heartbeat_interval": 0.1}, "idle_learner_heartbeat_interval"),
    ({"idle_election_timeout": 1.0}, "idle_election_timeout"),
])
def test_inconsistent_idle_settings_are_refused(change: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replace(IDLE, **change)


def test_a_peer_seen_alive_again_is_beaten_at_once_and_learns_the_leader() -> None:
    net = _idle_net()
    net.restart("l")
    assert net.nodes["l"].leader is None
    net.nodes["a"].peer_alive(net.now, "l")
    net.nodes["b"].peer_alive(net.now, "l")  # only the leader beats
    net.deliver()
    assert net.nodes["l"].leader == "a" and not net.sent("b", RaftHeartbeat)


def test_a_proposal_from_outside_a_tick_does_not_cut_the_check_quorum_window_short() -> None:
    """The core's clock is stale when propose() comes from outside a step or tick, and the
    driver may tick before the append's answer arrives: the check-quorum window under way must
    not be judged early (it once was, and healthy leaders stepped down)."""
    net = RaftNet(["a", "b"], cfg=IDLE)
    net.elect("a")
    net.run(IDLE.election_timeout_max + 1.0)
    a = net.nodes["a"]
    for i in range(6):
        net.now = a.lead.quorum_check_due + 0.01  # just past a check: its flags were reset
        net.tick("a")
        net.queue.clear()  # and no answer has come since
        net.advance(1.5)
        a.propose(EntryKind.KV_PUT, kv(i))
        net.flush("a")
        net.tick("a")  # before b's answer is delivered
        assert net.leaders() == ["a"], f"round {i}"
        net.deliver()
