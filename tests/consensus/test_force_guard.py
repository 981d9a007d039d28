"""Table tests of the forced reconfiguration's guard (consensus/force.py)."""

from __future__ import annotations

import pytest
from raft_net import CFG

from dpeer.consensus import EDGE, LAN, WAN, VotingConfig, force_after
from dpeer.consensus.force import force_refusal, reach_window, reachable_voters

U = {n: f"{i:032x}" for i, n in enumerate("abcde", 1)}
FIVE = VotingConfig.of("abcde", [], U)


def test_the_wait_is_twice_the_longest_election_timeout() -> None:
    assert (force_after(LAN), force_after(WAN), force_after(EDGE)) == (24.0, 30.0, 60.0)
    assert force_after(CFG) == 4.0 and reach_window(CFG) == 4.0  # no idle beats: 2 x election_timeout_max


def test_reachable_voters_come_from_recent_raft_contact_and_the_failure_detector() -> None:
    heard = {"b": 96.5, "c": 90.0, "x": 99.0}
    assert reachable_voters(FIVE, "a", 100.0, heard, {"d", "y"}, 4.0) == {"a", "b", "d"}


@pytest.mark.parametrize(
    "leading, me, voters, silent, reachable, reason",
    [
        (True, "a", {"a"}, 99.0, {"a"}, "leads a working quorum"),
        (False, "a", {"b"}, 99.0, {"a"}, "among the voters"),
        (False, "a", {"a", "z"}, 99.0, {"a"}, "['z'] are not"),
        (False, "a", {"a"}, 3.9, {"a"}, "a leader was known 3.9s ago; force is allowed only after 4s"),
        (False, "a", {"a", "b"}, 99.0, {"a", "b", "c"}, "3 of 5 voters are reachable (a, b, c)"),
        (False, "a", {"a", "b"}, 99.0, {"a", "b"}, ""),
        (False, "a", {"a"}, 4.0, {"a"}, ""),
    ],
)
def test_force_refusal(leading: bool, me: str, voters: set, silent: float, reachable: set, reason: str) -> None:
    got = force_refusal(FIVE, me, U[me], leading, voters, silent, reachable, CFG)
    assert (reason in got) if reason else got == ""


def test_a_node_on_a_new_store_may_not_force_under_its_old_name() -> None:
    got = force_refusal(FIVE, "a", "f" * 32, False, {"a"}, 99.0, {"a"}, CFG)
    assert "not a voter of the configuration in force" in got
