"""Table tests of one live holder per node id (issue 35, finding 4): whether a box may take a node
id another store holds (claim_verdict), the repair of a seat whose configured store no live box
holds (reclaim_seat, then plan_voters), the fault-tolerance figure, and the sightings they read.
Claims under the claimant's own store (a copy of a whole disk) and the copies sightings find are
in test_identity_copies.py."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from dpeer.consensus.config import LAN
from dpeer.consensus.voting import ChangeOp
from dpeer.daemon.decide.sightings import MAX_UIDS, Sightings, Windows
from dpeer.daemon.decide.proposals import (
    NOBODY, Answer, Claim, Holding, Observed, claim_verdict, fault_tolerance, plan_voters, reclaim_seat,
)
from dpeer.membership import MemberState
from dpeer.statemachine.entry import EntryKind
from dpeer.statemachine.payloads import MemberJoined
from dpeer.statemachine.state import ClusterState, Member

OLD, NEW, OTHER = "a" * 32, "b" * 32, "c" * 32  # n1's committed store, a claimant's, a third box's
HOME, AWAY = "10.0.0.1:7100", "10.0.0.9:7100"  # n1's committed address, another box's
WINDOWS = Windows.of(LAN)
HELD_SENTENCE = ("node id n1 is held by a live member at 10.0.0.1:7100 (store aaaaaaaa); give this box another "
                 "--node-id, or stop that one and wait until gossip holds it dead")


def cluster(status: str = "active", voter: bool = True, record_uid: str = OLD, configured: str = OLD) -> ClusterState:
    """n0 (the leader), n1 (the node id at stake) and n2; n1 a voter or a learner."""
    members = {"n0": Member("10.0.0.0:7100", "active", 1, 0, True, "0" * 32),
               "n1": Member(HOME, status, 2, 0, True, record_uid),
               "n2": Member("10.0.0.2:7100", "active", 3, 0, True, "2" * 32)}
    uids = {"n0": "0" * 32, "n1": configured, "n2": "2" * 32}
    voters, learners = (("n0", "n1", "n2"), ()) if voter else (("n0", "n2"), ("n1",))
    return ClusterState(members=MappingProxyType(members), voters=voters, learners=learners,
                        uids=MappingProxyType(uids), epoch=1)


def heard(*events: tuple, since: float = 0.0) -> Sightings:
    """n0's sightings: ("saw", uid, addr, t) of n1, or ("dead", t) for gossip's verdict on n1."""
    s = Sightings("n0", since)
    for event in events:
        if event[0] == "saw":
            s.saw("n1", event[1], event[2], event[3])
        else:
            s.declared_dead("n1", event[1])
    return s


@pytest.mark.parametrize("case, state, events, claim_addr, now, holding", [
    ("no record of the id", ClusterState(), [], AWAY, 5.0, Holding.FREE),
    ("the holder itself", cluster(), [("saw", OLD, HOME, 4.0)], HOME, 5.0, Holding.FREE),
    ("the holder left (or an operator removed it)", cluster(status="left"), [("saw", OLD, HOME, 4.9)], AWAY, 5.0,
     Holding.FREE),
    ("a duplicate while the holder answers", cluster(), [("saw", NEW, AWAY, 3.0), ("saw", OLD, HOME, 4.9)], AWAY,
     5.0, Holding.HELD),
    ("a duplicate of a holder that was committed dead but answers", cluster(status="dead"),
     [("saw", NEW, AWAY, 3.0), ("saw", OLD, HOME, 4.9)], AWAY, 5.0, Holding.HELD),
    ("a duplicate, gossip's old verdict on the holder superseded", cluster(),
     [("dead", 1.0), ("saw", NEW, AWAY, 3.0), ("saw", OLD, HOME, 4.9)], AWAY, 5.0, Holding.HELD),
    ("holder heard lately, not since the claimant appeared", cluster(), [("saw", OLD, HOME, 3.0),
                                                                          ("saw", NEW, AWAY, 4.0)], AWAY, 5.0,
     Holding.UNSURE),
    ("a claimant at the holder's address, holder silent since: its address not asked yet", cluster(),
     [("saw", OLD, HOME, 3.0), ("saw", NEW, HOME, 4.0)], HOME, 5.0, Holding.UNSURE),
    ("a claimant at the holder's address, the holder heard since (a clone advertising it)", cluster(),
     [("saw", NEW, HOME, 3.0), ("saw", OLD, HOME, 4.0)], HOME, 5.0, Holding.HELD),
    ("gossip held the id dead after the holder was last heard", cluster(),
     [("saw", OLD, HOME, 3.0), ("dead", 3.5), ("saw", NEW, AWAY, 4.0)], AWAY, 5.0, Holding.FREE),
    ("a voter holder silent past its window", cluster(), [("saw", OLD, HOME, 1.0), ("saw", NEW, AWAY, 9.5)], AWAY,
     1.0 + WINDOWS.voter + 0.1, Holding.FREE),
    ("a learner holder silent as long: its beats are slower", cluster(voter=False),
     [("saw", OLD, HOME, 1.0), ("saw", NEW, AWAY, 9.5)], AWAY, 1.0 + WINDOWS.voter + 0.1, Holding.UNSURE),
    ("a proven duplicate once the holder went silent past its window", cluster(),
     [("saw", NEW, AWAY, 1.0), ("saw", OLD, HOME, 2.0)], AWAY, 2.0 + WINDOWS.voter + 0.1, Holding.FREE),
    ("a holder never heard by a leader that just started", cluster(), [("saw", NEW, AWAY, 1.0)], AWAY, 2.0,
     Holding.UNSURE),
    ("a holder never heard by a leader listening past the window", cluster(), [("saw", NEW, AWAY, 9.0)], AWAY,
     WINDOWS.voter + 1.0, Holding.FREE),
])
def test_claim_verdict(case, state, events, claim_addr, now, holding) -> None:
    uid = OLD if case == "the holder itself" else NEW
    verdict = claim_verdict(state, Claim("n1", uid, claim_addr), heard(*events), WINDOWS, now)
    assert verdict.holding is holding, (case, verdict.reason)


# Asked who answers at the holder's committed address (HOME): the holder was heard at 3.0, the
# claimant appeared at 4.0 and claims HOME (a reinstall, or a clone whose config advertises HOME).
@pytest.mark.parametrize("case, answer, holding", [
    ("not asked, or no answer in time", None, Holding.UNSURE),
    ("the holder's store answers there: a clone advertising the holder's address", Answer("n1", OLD, "1" * 16),
     Holding.HELD),
    ("the claimant's store answers there: the box was reinstalled", Answer("n1", NEW, "2" * 16), Holding.FREE),
    ("nothing listens there: the claimant is not there, the holder may be between two starts", NOBODY,
     Holding.UNSURE),
    ("another node answers there: it tells nothing of the holder", Answer("n7", OTHER, "3" * 16), Holding.UNSURE),
])
def test_a_claim_at_the_holders_address_is_judged_by_who_answers_there(case, answer, holding) -> None:
    events = heard(("saw", OLD, HOME, 3.0), ("saw", NEW, HOME, 4.0))
    verdict = claim_verdict(cluster(), Claim("n1", NEW, HOME, answer=answer), events, WINDOWS, 5.0)
    assert verdict.holding is holding, (case, verdict.reason)
    if holding is Holding.HELD:
        assert verdict.reason == HELD_SENTENCE


def test_a_refused_claim_names_the_id_the_live_member_and_what_to_do() -> None:
    verdict = claim_verdict(cluster(), Claim("n1", NEW, AWAY), heard(("saw", NEW, AWAY, 3.0), ("saw", OLD, HOME, 4.9)),
                            WINDOWS, 5.0)
    assert verdict.reason == HELD_SENTENCE


def test_the_leaders_own_id_is_always_held_by_the_leader() -> None:
    state = cluster()
    verdict = claim_verdict(state, Claim("n0", NEW, AWAY), Sightings("n0", 0.0), WINDOWS, 100.0)
    assert verdict.holding is Holding.HELD and "node id n0 is held by a live member at 10.0.0.0:7100" in verdict.reason


def alive(state: str = "alive") -> dict[str, Observed]:
    return {n: Observed(MemberState(state if n == "n1" else "alive"), HOME, 0.0) for n in ("n0", "n1", "n2")}


LONG_AFTER = 1.0 + WINDOWS.voter + 0.1  # the configured store was last heard at 1.0


@pytest.mark.parametrize("case, state, events, gossip, proposal", [
    ("the rightful box answers, the configured (duplicate's) store is gone", cluster(configured=OLD),
     [("saw", OLD, HOME, 1.0), ("saw", NEW, AWAY, LONG_AFTER - 0.5)], alive(),
     MemberJoined("n1", AWAY, 0, False, NEW)),
    ("the configured store still answers", cluster(), [("saw", OLD, HOME, LONG_AFTER - 1.0),
                                                       ("saw", NEW, AWAY, LONG_AFTER - 0.5)], alive(), None),
    ("two other stores answer: no way to tell the rightful one", cluster(),
     [("saw", OLD, HOME, 1.0), ("saw", NEW, AWAY, LONG_AFTER - 0.5), ("saw", OTHER, "10.0.0.8:7100", LONG_AFTER)],
     alive(), None),
    ("gossip holds the id dead", cluster(), [("saw", OLD, HOME, 1.0), ("saw", NEW, AWAY, LONG_AFTER - 0.5)],
     alive("dead"), None),
    ("the other store was heard too long ago", cluster(), [("saw", OLD, HOME, 0.5), ("saw", NEW, AWAY, 1.0)],
     alive(), None),
    ("the record already names another store: plan_voters swaps the seat", cluster(record_uid=NEW),
     [("saw", OLD, HOME, 1.0), ("saw", NEW, AWAY, LONG_AFTER - 0.5)], alive(), None),
])
def test_reclaim_seat(case, state, events, gossip, proposal) -> None:
    decision = reclaim_seat(state, gossip, heard(*events), WINDOWS, LONG_AFTER)
    assert decision.proposal == proposal, (case, decision.reason)


def test_a_seat_held_by_a_dead_duplicate_goes_back_to_the_rightful_box_without_losing_quorum() -> None:
    """The end state of the finding: the voters name the dead duplicate's store; the rightful box
    answers under its own. The record is fixed first, then plan_voters removes the seat (n0 and
    n2 remain, a live quorum of two) and adds n1 back as a learner under the live store."""
    dup, rightful = OTHER, OLD
    state = cluster(record_uid=dup, configured=dup)
    events = [("saw", dup, AWAY, 1.0), ("saw", rightful, HOME, LONG_AFTER - 0.2)]
    fixed = reclaim_seat(state, alive(), heard(*events), WINDOWS, LONG_AFTER)
    assert fixed.proposal == MemberJoined("n1", HOME, 0, False, rightful), fixed.reason
    members = dict(state.members)
    members["n1"] = Member(HOME, "active", 9, 0, False, rightful)
    recorded = ClusterState(members=MappingProxyType(members), voters=state.voters, uids=state.uids, epoch=1)
    removal = plan_voters(recorded, alive(), LONG_AFTER, 30.0, 5)
    assert (removal.proposal.op, removal.proposal.node) == (ChangeOp.REMOVE, "n1") and "new disk" in removal.reason
    uids = {n: u for n, u in state.uids.items() if n != "n1"}
    removed = ClusterState(members=MappingProxyType(members), voters=("n0", "n2"), uids=MappingProxyType(uids), epoch=1)
    assert reclaim_seat(removed, alive(), heard(*events), WINDOWS, LONG_AFTER).proposal is None
    learner = plan_voters(removed, alive(), LONG_AFTER, 30.0, 5)
    assert learner.kind is EntryKind.CONFIG_CHANGE
    assert (learner.proposal.op, learner.proposal.node, learner.proposal.uid) == (ChangeOp.ADD_LEARNER, "n1", rightful)


@pytest.mark.parametrize("voters, answering, expected", [
    (("n0", "n1", "n2"), {"n0", "n1", "n2"}, (3, 3, 1, ())),
    (("n0", "n1", "n2"), {"n0", "n2"}, (3, 2, 0, ("n1",))),
    (("n0", "n1", "n2", "n3", "n4"), {"n0", "n1", "n2", "n3"}, (5, 4, 1, ("n4",))),
    (("n0", "n1", "n2", "n3", "n4"), {"n0", "n1", "n2"}, (5, 3, 0, ("n3", "n4"))),
    (("n0", "n1", "n2", "n3", "n4"), {"n0", "n1"}, (5, 2, 0, ("n2", "n3", "n4"))),
    (("n0", "n1"), {"n0", "n1"}, (2, 2, 0, ())),
    (("n0",), {"n0"}, (1, 1, 0, ())),
])
def test_fault_tolerance(voters, answering, expected) -> None:
    t = fault_tolerance(voters, answering)
    assert (t.voters, t.live_voters, t.can_lose, t.unheld) == expected


def test_windows_cover_the_slowest_beat_each_role_answers() -> None:
    assert (WINDOWS.voter, WINDOWS.other) == (2 * LAN.idle_heartbeat_interval, 2 * LAN.idle_learner_heartbeat_interval)


def test_sightings_keep_first_and_last_and_drop_the_least_recent_store() -> None:
    s = Sightings("n0", 0.0)
    s.saw("n1", OLD, HOME, 1.0)
    s.saw("n1", OLD, AWAY, 2.0)
    assert (s.seen("n1", OLD).first, s.seen("n1", OLD).last, s.seen("n1", OLD).addr) == (1.0, 2.0, AWAY)
    for i in range(MAX_UIDS):
        s.saw("n1", f"{i:032x}", HOME, 3.0 + i)
    assert s.seen("n1", OLD) is None and len(s.uids("n1")) == MAX_UIDS
    assert s.dead_at("n1") is None
    s.declared_dead("n1", 9.0)
    assert s.dead_at("n1") == 9.0 and s.seen("n2", OLD) is None
