"""Table tests of the no-leader diagnosis shown in `dpeer status --json` and logged."""

from __future__ import annotations

import pytest

from dpeer.consensus import VotingConfig
from dpeer.daemon.decide.quorum import explain_no_leader

U = {n: f"{i:032x}" for i, n in enumerate(["n0", "n1", "n2", "n3", "n4"], 1)}
NEW = "f" * 32


def conf(*voters: str, epoch: int = 1) -> VotingConfig:
    return VotingConfig.of(voters, [], {v: U[v] for v in voters}, epoch)


@pytest.mark.parametrize(
    "me, my_uid, membership, seen, alive, newest, reason, action",
    [
        # the liveness cousin of issue 14: voters n0, n1; n1 came back on a wiped disk
        ("n0", U["n0"], conf("n0", "n1"), {"n1": NEW}, {"n1"}, 1,
         "1 of 2 voters can vote (n0), 2 needed; n1 lost its data (seen with store uid ffffffff",
         "dpeer force --addr 10.0.0.1:7100 --voters n0 --yes"),
        ("n0", U["n0"], conf("n0", "n1", "n2"), {"n1": U["n1"]}, set(), 1,
         "no leader can be elected: 1 of 3 voters can vote (n0), 2 needed; n1 is unreachable; n2 is unreachable",
         "--voters n0 --yes"),
        ("n0", U["n0"], conf("n0", "n1", "n2"), {}, {"n1"}, 1, "an election is under way: 2 of 3", None),
        ("n1", NEW, conf("n0", "n1"), {}, {"n0"}, 1, "this node's store is new (uid ffffffff)", "replaces"),
        ("n1", U["n1"], conf("n0", "n1", "n2"), {}, set(), 2, "peers follow cluster epoch 2", "data dir aside"),
        ("n9", NEW, VotingConfig(), {}, set(), 0, "not learned a voting configuration", "--join"),
    ],
)
def test_explain_no_leader(me: str, my_uid: str, membership: VotingConfig, seen: dict, alive: set, newest: int,
                           reason: str, action: str | None) -> None:
    why = explain_no_leader(me, my_uid, membership, seen, alive, newest, "10.0.0.1:7100")
    assert reason in why.reason
    assert (why.action is None) if action is None else (action in why.action)


def test_a_node_that_cannot_vote_itself_gets_no_force_advice() -> None:
    why = explain_no_leader("n2", U["n2"], conf("n0", "n1"), {}, set(), 1, "h:1")
    assert "0 of 2 voters can vote" in why.reason and why.action is None
