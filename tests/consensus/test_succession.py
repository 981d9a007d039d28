"""Table test of the order in which a dead leader's voters campaign."""

from __future__ import annotations

import pytest

from dpeer.consensus.succession import successor_delay


@pytest.mark.parametrize(
    "voters, me, lost, jitter, expected, why",
    [
        (["a", "b", "c"], "b", "a", 0.0, 0.0, "first successor: at once"),
        (["a", "b", "c"], "c", "a", 0.0, 0.15, "second: one slot of half election_timeout_min later"),
        (["a", "b", "c"], "a", "c", 0.0, 0.0, "the order skips the dead leader, wherever it stood"),
        (["a", "b", "c", "d", "e"], "e", "a", 0.0, 0.45, "fourth successor: three slots"),
        (["a", "b", "c"], "b", "a", 0.999, 0.0, "a voter's place is its own: no jitter"),
        (["a", "b"], "l", "a", 0.0, 0.15, "a learner after every voter"),
        (["a", "b"], "l", "a", 0.999, 0.15 + 0.0375, "learners share that place: jitter adds at most a quarter slot"),
    ],
)
def test_successor_delay(voters, me, lost, jitter, expected, why) -> None:
    assert successor_delay(voters, me, lost, 0.3, jitter) == pytest.approx(expected, abs=1e-3), why
