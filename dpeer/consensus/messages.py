"""Raft messages as frozen dataclasses; the gRPC transport maps each one to a protobuf message.

The sender's identity is not repeated in the messages: the transport knows (and authenticates)
who sent a message and passes it to RaftNode.step as a `Peer` (node id, store uid, cluster
epoch). validate() rejects absurd values before the core sees them; it raises InvalidRaftMessage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from dpeer.consensus.voting import VotingConfig
from dpeer.consensus.entry import Entry
from dpeer.ids import valid_uid

MAX_ID_LEN = 256
_MAX_U64 = (1 << 63) - 1  # terms and indexes stay below 2**63 so term + 1 always fits in a u64


class InvalidRaftMessage(ValueError):
    """A message field is out of range or inconsistent; drop the message."""


def _u64(name: str, value: int) -> None:
    if type(value) is not int or not 0 <= value <= _MAX_U64:
        raise InvalidRaftMessage(f"{name} must be an int in 0..2**63-1, got {value!r}")


def _node(name: str, value: str) -> None:
    if type(value) is not str or not 0 < len(value) <= MAX_ID_LEN:
        raise InvalidRaftMessage(f"{name} must be a node id of 1..{MAX_ID_LEN} chars, got {value!r}")


def _position(index: int, term: int, msg_term: int) -> None:
    """A log position (index, term): term 0 only at index 0, never above the message's term."""
    _u64("index", index)
    _u64("log term", term)
    if (index == 0) != (term == 0) or term > msg_term:
        raise InvalidRaftMessage(f"log position ({index}, {term}) is impossible in term {msg_term}")


@dataclass(frozen=True)
class Peer:
    """Who sent a message: its node id, the uid of its store (drawn when the store was created)
    and the epoch of the configuration it follows (0 before it knows any)."""

    node_id: str
    uid: str
    epoch: int

    def validate(self) -> None:
        """Raise InvalidRaftMessage on an absurd identity."""
        _node("node_id", self.node_id)
        if not valid_uid(self.uid):
            raise InvalidRaftMessage(f"a store uid is 32 lowercase hex digits, got {self.uid!r}")
        _u64("epoch", self.epoch)


@dataclass(frozen=True)
class VoteRequest:
    """A (pre-)candidate asks for a vote in `term` (for a pre-vote: the term it would use)."""

    term: int
    candidate: str
    last_index: int
    last_term: int
    pre_vote: bool

    def validate(self) -> None:
        """Raise InvalidRaftMessage on absurd fields."""
        _u64("term", self.term)
        _node("candidate", self.candidate)
        _position(self.last_index, self.last_term, self.term)
        if self.term == 0 or type(self.pre_vote) is not bool:
            raise InvalidRaftMessage("a vote request needs a term >= 1 and a bool pre_vote")


LEADER_LEASE = "leader_lease"  # a VoteResponse's reason: the voter still hears a leader (or is one)


@dataclass(frozen=True)
class VoteResponse:
    """The answer to a VoteRequest; a granted pre-vote echoes the requested term."""

    term: int
    granted: bool
    pre_vote: bool
    reason: str = ""

    def validate(self) -> None:
        """Raise InvalidRaftMessage on absurd fields."""
        _u64("term", self.term)
        if type(self.granted) is not bool or type(self.pre_vote) is not bool:
            raise InvalidRaftMessage("granted and pre_vote must be bools")
        if type(self.reason) is not str or len(self.reason) > 200:
            raise InvalidRaftMessage("reason must be a short string")


@dataclass(frozen=True)
class AppendRequest:
    """The leader's entries after (prev_index, prev_term), plus its commit index."""

    term: int
    leader: str
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int

    def validate(self) -> None:
        """Raise InvalidRaftMessage on absurd fields (entries must be contiguous, terms ordered)."""
        _u64("term", self.term)
        _node("leader", self.leader)
        _position(self.prev_index, self.prev_term, self.term)
        _u64("commit", self.commit)
        index, term = self.prev_index, self.prev_term
        for e in self.entries:
            if e.index != index + 1 or not term <= e.term <= self.term:
                raise InvalidRaftMessage(f"entry ({e.index}, {e.term}) does not follow ({index}, {term})")
            index, term = e.index, e.term


@dataclass(frozen=True)
class AppendResponse:
    """Success: the follower's log matches the leader's up to match_index. Rejection: match_index
    is the rejected prev_index, and (reject_hint, reject_term) is the follower's last entry at or
    below it with term <= the leader's prev_term (etcd's fast backoff)."""

    term: int
    success: bool
    match_index: int
    reject_hint: int = 0
    reject_term: int = 0

    def validate(self) -> None:
        """Raise InvalidRaftMessage on absurd fields."""
        _u64("term", self.term)
        _u64("match_index", self.match_index)
        _u64("reject_hint", self.reject_hint)
        _u64("reject_term", self.reject_term)
        if type(self.success) is not bool or self.reject_term > self.term:
            raise InvalidRaftMessage("success must be a bool and reject_term <= term")


@dataclass(frozen=True)
class RaftHeartbeat:
    """Leader liveness; commit is min(follower's match, leader commit); read_seq confirms reads;
    idle says the leader has nothing in flight and beats slowly (RaftConfig's idle settings)."""

    term: int
    leader: str
    commit: int
    read_seq: int
    idle: bool = False

    def validate(self) -> None:
        """Raise InvalidRaftMessage on absurd fields."""
        _u64("term", self.term)
        _node("leader", self.leader)
        _u64("commit", self.commit)
        _u64("read_seq", self.read_seq)
        if type(self.idle) is not bool:
            raise InvalidRaftMessage("idle must be a bool")


@dataclass(frozen=True)
class RaftHeartbeatResponse:
    """A follower acknowledges a heartbeat, echoing its read_seq."""

    term: int
    read_seq: int

    def validate(self) -> None:
        """Raise InvalidRaftMessage on absurd fields."""
        _u64("term", self.term)
        _u64("read_seq", self.read_seq)


@dataclass(frozen=True)
class SnapshotRequest:
    """The leader's snapshot for a follower behind its first_index; acked by an AppendResponse."""

    term: int
    leader: str
    index: int
    term_of_index: int
    data: bytes
    voters: tuple[str, ...]
    learners: tuple[str, ...]
    uids: tuple[tuple[str, str], ...]
    epoch: int
    forced_at: float

    def validate(self) -> None:
        """Raise InvalidRaftMessage on absurd fields."""
        _u64("term", self.term)
        _node("leader", self.leader)
        _position(self.index, self.term_of_index, self.term)
        if self.index == 0 or type(self.data) is not bytes or not self.voters:
            raise InvalidRaftMessage("a snapshot needs an index >= 1, bytes data and voters")
        for n in self.voters + self.learners:
            _node("member", n)
        if set(self.voters) & set(self.learners):
            raise InvalidRaftMessage("a node cannot be both voter and learner")
        if {n for n, _ in self.uids} != set(self.voters) | set(self.learners) or len(self.uids) != len(
                set(self.voters) | set(self.learners)) or not all(valid_uid(u) for _, u in self.uids):
            raise InvalidRaftMessage("a snapshot names every member once with its store uid")
        _u64("epoch", self.epoch)
        if self.epoch == 0 or type(self.forced_at) is not float or not 0.0 <= self.forced_at < 1e12:
            raise InvalidRaftMessage("a snapshot needs an epoch >= 1 and a forced_at in unix seconds")

    @property
    def membership(self) -> VotingConfig:
        """The configuration at the snapshot's index."""
        return VotingConfig.of(self.voters, self.learners, dict(self.uids), self.epoch, self.forced_at)


Message = Union[
    VoteRequest, VoteResponse, AppendRequest, AppendResponse, RaftHeartbeat, RaftHeartbeatResponse,
    SnapshotRequest,
]
