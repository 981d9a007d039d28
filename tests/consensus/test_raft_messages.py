"""Every message validates its fields and rejects absurd values."""

from __future__ import annotations

import pytest
from raft_helpers import entry

from dpeer.peer.consensus.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    InvalidMessage,
    SnapshotRequest,
    VoteRequest,
    VoteResponse,
)

GOOD = [
    VoteRequest(3, "a", 5, 2, True),
    VoteResponse(3, True, False),
    AppendRequest(3, "a", 4, 2, (entry(5, 2), entry(6, 3)), 4),
    AppendRequest(1, "a", 0, 0, (), 0),
    AppendResponse(3, False, 9, 4, 2),
    Heartbeat(3, "a", 7, 1),
    HeartbeatResponse(3, 1),
    SnapshotRequest(3, "a", 10, 2, b"x", ("a", "b"), ("c",)),
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
    Heartbeat(2**64, "a", 0, 0),
    HeartbeatResponse(3, -1),
    SnapshotRequest(3, "a", 0, 0, b"x", ("a",), ()),
    SnapshotRequest(3, "a", 10, 2, b"x", (), ()),
    SnapshotRequest(3, "a", 10, 2, b"x", ("a",), ("a",)),
    SnapshotRequest(3, "a", 10, 2, "x", ("a",), ()),          # type: ignore[arg-type]
]


@pytest.mark.parametrize("msg", GOOD, ids=lambda m: type(m).__name__)
def test_sane_messages_validate(msg: object) -> None:
    msg.validate()  # type: ignore[attr-defined]


@pytest.mark.parametrize("msg", BAD, ids=lambda m: type(m).__name__)
def test_absurd_messages_are_rejected(msg: object) -> None:
    with pytest.raises(InvalidMessage):
        msg.validate()  # type: ignore[attr-defined]
