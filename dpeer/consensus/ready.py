"""What the core hands the caller (Ready) and the results of its commands.

Ready contract: first persist, each step durable before the next: set_hard_state(term,
voted_for); install_snapshot(snapshot); append(entries); set_commit(hard_state.commit). Then
send `messages` and apply `committed_entries` in order, in either order (the daemon sends
first, so an acknowledgement never waits on its own apply); then RaftNode.advance(ready). Do
not step, tick or propose between ready() and advance().
Persisting before sending is what makes a vote or an acknowledgement a promise.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple, Union

from dpeer.consensus.storage import Snapshot, Storage
from dpeer.statemachine.entry import Entry


class Role(StrEnum):
    """A node's role in its current term (its value is what status shows)."""

    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True)
class HardState:
    """Durable Raft state: Storage.set_hard_state(term, voted_for) and set_commit(commit)."""

    term: int
    voted_for: str | None
    commit: int


@dataclass(frozen=True)
class SoftState:
    """Volatile state worth showing (status, metrics): who leads and this node's role."""

    leader: str | None
    role: Role


@dataclass(frozen=True)
class ReadState:
    """A confirmed ReadIndex: reads for request_id are linearizable once applied >= index."""

    request_id: int
    index: int


class Outgoing(NamedTuple):
    """One message to send: to node `dst`, meant for its store `uid` (the receiver drops a message
    meant for another store: a box that lost its disk is not the member it replaced), stamped by
    the caller with this node's identity (RaftNode.identity)."""

    dst: str
    uid: str
    msg: Any


@dataclass(frozen=True)
class Ready:
    """One batch of work for the caller; see the module docstring for the order."""

    hard_state: HardState | None
    soft_state: SoftState | None
    entries: tuple[Entry, ...]
    snapshot: Snapshot | None
    committed_entries: tuple[Entry, ...]
    messages: tuple[Outgoing, ...]
    read_states: tuple[ReadState, ...]


@dataclass(frozen=True)
class Proposed:
    """The entry was appended to the leader's log at (index, term); it may still be lost
    if leadership changes before it commits: wait until it is applied with the same term."""

    index: int
    term: int


@dataclass(frozen=True)
class NotLeader:
    """Only the leader accepts this; `leader` is the last known leader (None when unknown)."""

    leader: str | None


@dataclass(frozen=True)
class Refused:
    """The leader refused the command (pending config change, voter cap, bad payload...)."""

    reason: str


@dataclass(frozen=True)
class ReadRequested:
    """A ReadIndex is under way; its ReadState with this request_id will appear in a Ready."""

    request_id: int


@dataclass(frozen=True)
class AcceptResult:
    """Outcome of accept_committed: accepted or not (with a reason) and the commit index after."""

    accepted: bool
    commit: int
    reason: str = ""


def persist(storage: Storage, rd: Ready) -> None:
    """The contract's first half: make rd durable in storage, hard state, snapshot, entries and
    commit index in that order (what the simulator and the tests' drivers share; the daemon
    writes the same in one LMDB transaction)."""
    hs = rd.hard_state
    if hs is not None:
        storage.set_hard_state(hs.term, hs.voted_for)
    if rd.snapshot is not None:
        storage.install_snapshot(rd.snapshot)
    if rd.entries:
        storage.append(rd.entries)
    if hs is not None:
        storage.set_commit(hs.commit)


ProposeResult = Union[Proposed, NotLeader, Refused]
ReadResult = Union[ReadRequested, NotLeader]
