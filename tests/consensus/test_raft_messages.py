"""Every message validates its fields and rejects absurd values."""

from __future__ import annotations

from dataclasses import replace

import pytest
from raft_net import entry, uid_for

from dpeer.consensus.messages import (
    AppendRequest,
    AppendResponse,
    RaftHeartbeat,
    RaftHeartbeatResponse,
    InvalidRaftMessage,
    Peer,
    SnapshotRequest,
    VoteRequest,
    VoteResponse,
)

U = {n: uid_for(n) for n in "abc"}


def snap(voters: tuple[str, ...], learners: tuple[str, ...], index: int = 10, data: object = b"x", epoch: int = 1,
         uids: tuple[tuple[str, str], ...] | None = None) -> SnapshotRequest:
    named = tuple(sorted((n, U[n]) for n in set(voters) | set(learners))) if uids is None else uids
    return SnapshotRequest(3, "a", index, 2 if index else 0, data, voters, learners, named, epoch, 0.0)  # type: ignore[arg-type]


GOOD = [
    VoteRequest(3, "a", 5, 2, True),
    VoteResponse(3, True, False),
    AppendRequest(3, "a", 4, 2, (entry(5, 2), entry(6, 3)), 4),
    AppendRequest(1, "a", 0, 0, (), 0),
    AppendResponse(3, False, 9, 4, 2),
    RaftHeartbeat(3, "a", 7, 1),
    RaftHeartbeatResponse(3, 1),
    snap(("a", "b"), ("c",)),
    Peer("a", U["a"], 0),
    Peer("a", U["a"], 7),
]

BAD = [
    VoteRequest(-1, "a", 0, 0, False),
    VoteRequest(3, "", 0, 0, False),
    VoteRequest(3, "a", 5, 4, False),            # last_term above the term
    VoteRequest(3, "a", 5, 0, False),            # index without a term
    VoteRequest(0, "a", 0, 0, False),
    VoteResponse(3, "yes", False),               # type: ignore[arg-type]
    AppendRequest(3, "a", 4, 2, (entry(6, 2),), 4),          # gap
    AppendRequest(3, "a", 4, 2, (entry(5, 1),), 4),          # term goes back
    AppendRequest(3, "a", 4, 2, (entry(5, 4),), 4),          # entry from the future
    AppendRequest(3, "x" * 300, 0, 0, (), 0),
    AppendResponse(3, True, -5),
    AppendResponse(3, False, 9, 4, 7),
    RaftHeartbeat(2**64, "a", 0, 0),
    RaftHeartbeatResponse(3, -1),
    snap(("a",), (), index=0),
    snap((), ()),
    snap(("a",), ("a",)),
    snap(("a",), (), data="x"),
    replace(snap(("a", "b"), ()), forced_at=-1.0),
    replace(snap(("a", "b"), ()), forced_at=0),               # an int, not a float
    snap(("a",), (), epoch=0),
    snap(("a", "b"), (), uids=(("a", U["a"]),)),             # b has no uid
    snap(("a",), (), uids=(("a", "A" * 32),)),                # not lowercase hex
    Peer("a", "", 0),
    Peer("a", U["a"][:-1], 0),
    Peer("", U["a"], 0),
    Peer("a", U["a"], -1),
]


@pytest.mark.parametrize("msg", GOOD, ids=lambda m: type(m).__name__)
def test_sane_messages_validate(msg: object) -> None:
    msg.validate()  # type: ignore[attr-defined]


@pytest.mark.parametrize("msg", BAD, ids=lambda m: type(m).__name__)
def test_absurd_messages_are_rejected(msg: object) -> None:
    with pytest.raises(InvalidRaftMessage):
        msg.validate()  # type: ignore[attr-defined]
