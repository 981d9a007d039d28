"""Table tests of one live process per node id and store (issue 35, finding 4, a full copy of a
disk): the boots the sightings keep and when each started, the copies they show (two boots of one
store both heard after the newer started; a restart is none), the voters held twice, and whether
a join under the claimant's own store is free (claim_verdict)."""

from __future__ import annotations

import math
from types import MappingProxyType

import pytest

from dpeer.consensus.config import LAN
from dpeer.daemon.decide.sightings import MAX_BOOTS, Sightings, Windows, copies, copy_of, held_by_another, held_twice
from dpeer.daemon.decide.proposals import NOBODY, Answer, Claim, Holding, claim_verdict
from dpeer.statemachine.state import ClusterState, Member

UID = "a" * 32  # n1's store, on the original disk and on its copy
ORIG, COPY, THIRD = "1" * 16, "2" * 16, "3" * 16  # boots: the original, its copy (or its restart), a third
HOME, AWAY = "10.0.0.1:7100", "10.0.0.9:7100"
WINDOW = Windows.of(LAN).voter
COPY_SENTENCE = ("node id n1 and its store aaaaaaaa are held by another live process at 10.0.0.1:7100 (boot 11111111, "
                 "started before this one); this box runs a copy of its disk: give it a fresh data dir and another "
                 "--node-id")


def heard(*events: tuple, since: float = 0.0) -> Sightings:
    """n0's sightings of n1 under UID: (boot, addr, t, up) each; up None when the message told no age."""
    s = Sightings("n0", since, "0" * 32, "0" * 16, "10.0.0.0:7100")
    for boot, addr, t, up in events:
        s.saw("n1", UID, addr, t, boot, up)
    return s


def test_a_boot_started_when_its_first_message_says_and_the_earliest_estimate_wins() -> None:
    s = heard((ORIG, HOME, 100.0, 40.0), (ORIG, HOME, 101.0, 40.5), (COPY, AWAY, 102.0, None))
    boots = s.boots("n1", UID)
    assert (boots[ORIG].first, boots[ORIG].last, boots[ORIG].started, boots[ORIG].last_sent) == (100.0, 101.0, 60.0,
                                                                                                100.5)
    assert boots[COPY].started == 102.0  # a join tells no age: its first sighting
    s.saw("n1", UID, AWAY, 103.0, COPY, 3.0)
    assert s.boots("n1", UID)[COPY].started == 100.0
    s.saw("n1", UID, HOME, 104.0)  # an older peer sends no boot: the store is seen, no boot noted
    assert set(s.boots("n1", UID)) == {ORIG, COPY} and s.seen("n1", UID).last == 104.0


def test_boots_are_bounded_the_least_recently_heard_first() -> None:
    s = heard(*[(f"{i:016x}", HOME, float(i), 0.0) for i in range(MAX_BOOTS + 2)])
    assert sorted(s.boots("n1", UID)) == [f"{i:016x}" for i in range(2, MAX_BOOTS + 2)]


def test_the_owners_own_boot_counts_as_heard_always() -> None:
    s = Sightings("n1", 5.0, UID, ORIG, HOME)
    own = s.boots("n1", UID)[ORIG]
    assert (own.started, own.last, own.addr) == (5.0, math.inf, HOME) and s.boots("n1", "b" * 32) == {}


@pytest.mark.parametrize("case, events, now, copy", [
    ("one process", [(ORIG, HOME, 10.0, 9.0)], 11.0, None),
    ("a restart: the old process last heard before the new one started", [(ORIG, HOME, 10.0, 9.0),
                                                                          (COPY, HOME, 14.0, 2.0)], 14.5, None),
    ("a copy: the original heard after the copy started", [(ORIG, HOME, 10.0, 9.0), (COPY, AWAY, 11.0, 0.5),
                                                           (ORIG, HOME, 11.2, 10.2)], 11.5, (ORIG, COPY)),
    ("a copy heard first by a node that just started: the ages order them", [(COPY, AWAY, 11.0, 0.5),
                                                                              (ORIG, HOME, 11.2, 10.2)], 11.5,
     (ORIG, COPY)),
    ("a restart seen through a backlog: the old process's last message taken in late, beside the new one's",
     [(ORIG, HOME, 10.0, 9.0), (ORIG, HOME, 20.0, 9.5), (COPY, HOME, 20.0, 0.5)], 20.1, None),
    ("the original heard before the copy started only", [(ORIG, HOME, 10.0, 9.0), (COPY, AWAY, 11.0, 0.5)], 11.5,
     None),
    ("a copy whose original went silent past the window", [(ORIG, HOME, 10.0, 9.0), (COPY, AWAY, 11.0, 0.5),
                                                           (ORIG, HOME, 11.2, 10.2)], 11.3 + WINDOW, None),
])
def test_copies(case, events, now, copy) -> None:
    found = copies(heard(*events), "n1", UID, WINDOW, now)
    assert [(c.older[0], c.newer[0]) for c in found] == ([copy] if copy else []), case


def test_a_copy_names_the_original_and_is_told_to_stop() -> None:
    s = heard((ORIG, HOME, 10.0, 9.0), (COPY, AWAY, 11.0, 0.5), (ORIG, HOME, 11.2, 10.2))
    copy = copy_of(s, "n1", UID, COPY, WINDOW, 11.5)
    assert copy is not None and copy.sentence() == COPY_SENTENCE
    assert copy.describe(11.6) == ("node id n1 and its store aaaaaaaa are held by two live processes: boot 11111111 "
                                   "at 10.0.0.1:7100 (up 11s) and boot 22222222 at 10.0.0.9:7100 (up 1s), a copy of "
                                   "its disk")
    assert copy_of(s, "n1", UID, ORIG, WINDOW, 11.5) is None  # the original is never the one refused


def test_held_twice_names_the_voters_two_processes_answer_for() -> None:
    s = heard((ORIG, HOME, 10.0, 9.0), (COPY, AWAY, 11.0, 0.5), (ORIG, HOME, 11.2, 10.2))
    twice = held_twice(s, ["n0", "n1", "n2"], {"n0": "0" * 32, "n1": UID, "n2": "2" * 32}, WINDOW, 11.5)
    assert list(twice) == ["n1"] and twice["n1"].newer[0] == COPY
    assert held_twice(s, ["n1"], {"n1": "b" * 32}, WINDOW, 11.5) == {}  # the configuration names another store


def cluster() -> ClusterState:
    members = {"n0": Member("10.0.0.0:7100", "active", 1, 0, True, "0" * 32), "n1": Member(HOME, "active", 2, 0, True, UID)}
    return ClusterState(members=MappingProxyType(members), voters=("n0", "n1"),
                        uids=MappingProxyType({"n0": "0" * 32, "n1": UID}), epoch=1)


LATER = WINDOW + 20.0  # a leader that has listened past the window


@pytest.mark.parametrize("case, events, boot, answer, now, holding", [
    ("an older peer tells no boot", [], "", None, 5.0, Holding.FREE),
    ("the only process, heard by a leader listening past the window", [(COPY, AWAY, LATER - 1, None)], COPY, None,
     LATER, Holding.FREE),
    ("the only process, a leader that just started: its address not asked yet", [(COPY, AWAY, 4.0, None)], COPY,
     None, 5.0, Holding.UNSURE),
    ("the only process, a leader that just started, and it answers at the address", [(COPY, HOME, 4.0, None)],
     COPY, Answer("n1", UID, COPY, 3.0), 5.0, Holding.FREE),
    ("a restart within the window: the old process not heard since, the new one answers at its address",
     [(ORIG, HOME, LATER - 3, 50.0), (COPY, HOME, LATER - 1, 1.0)], COPY, Answer("n1", UID, COPY, LATER - 2),
     LATER, Holding.FREE),
    ("a restart on another address: nothing listens at the old one", [(ORIG, HOME, LATER - 3, 50.0),
                                                                      (COPY, AWAY, LATER - 1, 1.0)], COPY, NOBODY,
     LATER, Holding.FREE),
    ("a restart on another address that did not answer in time", [(ORIG, HOME, LATER - 3, 50.0),
                                                                  (COPY, AWAY, LATER - 1, 1.0)], COPY, None, LATER,
     Holding.UNSURE),
    ("a copy: the original heard after the copy started", [(ORIG, HOME, LATER - 3, 50.0), (COPY, AWAY, LATER - 1, 1.0),
                                                           (ORIG, HOME, LATER - 0.5, 52.5)], COPY, None, LATER,
     Holding.HELD),
    ("a copy: the original answers at the record's address", [(ORIG, HOME, LATER - 3, 50.0),
                                                              (COPY, AWAY, LATER - 1, 1.0)], COPY,
     Answer("n1", UID, ORIG, LATER - 53), LATER, Holding.HELD),
    ("a copy that told no age: its first sighting is its start", [(ORIG, HOME, LATER - 3, 50.0),
                                                                  (COPY, AWAY, LATER - 1, None)], COPY,
     Answer("n1", UID, ORIG, LATER - 53), LATER, Holding.HELD),
    ("the older process: a newer one answers at the address", [(ORIG, AWAY, LATER - 1, 50.0)], ORIG,
     Answer("n1", UID, COPY, LATER - 1), LATER, Holding.FREE),
])
def test_claim_verdict_under_the_claimants_own_store(case, events, boot, answer, now, holding) -> None:
    verdict = claim_verdict(cluster(), Claim("n1", UID, AWAY, boot, answer), heard(*events), Windows.of(LAN), now)
    assert verdict.holding is holding, (case, verdict.reason)
    if holding is Holding.HELD:
        assert verdict.reason == COPY_SENTENCE


def test_a_copy_of_the_leaders_own_disk_is_held_by_the_leader() -> None:
    s = Sightings("n1", 0.0, UID, ORIG, HOME)
    s.saw("n1", UID, AWAY, LATER, COPY, 1.0)
    verdict = claim_verdict(cluster(), Claim("n1", UID, AWAY, COPY), s, Windows.of(LAN), LATER)
    assert (verdict.holding, verdict.reason) == (Holding.HELD, held_by_another("n1", UID, HOME, ORIG))
