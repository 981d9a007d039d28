"""What the core hands the caller (Ready) and the results of its commands.

Ready contract: first persist (persist() below, the one persist path): install the snapshot,
then hard state, entries and commit index in one durable write (StorageWriter.save). Then
apply `committed_entries` in order, then send `messages`; then RaftNode.advance(ready).
drive() below does exactly that, for the daemon's node and the simulations alike. Do not step,
tick or propose between ready() and advance().
Persisting before sending is what makes a vote or an acknowledgement a promise.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple, Protocol, Union

from dpeer.consensus.storage import HardState, Snapshot, StorageWriter
from dpeer.consensus.entry import Entry


class Role(StrEnum):
    """A node's role in its current term (its value is what status shows)."""

    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


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


class ReadyNode(Protocol):
    """The side of RaftNode a Ready driver uses."""

    def has_ready(self) -> bool:
        """Whether a Ready is pending."""

    def ready(self) -> Ready:
        """The pending Ready."""

    def advance(self, rd: Ready) -> None:
        """The Ready was handled."""


class ReadyHandler(Protocol):
    """The caller's I/O for one Ready, called by drive() in the contract's order."""

    def persist(self, rd: Ready) -> None:
        """Hard state, snapshot, entries and commit index, durable before anything else."""

    def apply(self, entries: tuple[Entry, ...]) -> None:
        """Apply the newly committed entries, in order."""

    def send(self, messages: tuple[Outgoing, ...]) -> None:
        """Release the messages (only now: they promise what was persisted)."""

    def observe(self, rd: Ready) -> None:
        """Read states, the soft state, whatever else the caller shows or waits on."""


def drive(node: ReadyNode, handler: ReadyHandler) -> int:
    """Handle every pending Ready in the documented order (persist, apply, send, then advance);
    the one driver the daemon's node and the simulations share. Returns how many it handled."""
    count = 0
    while node.has_ready():
        rd = node.ready()
        handler.persist(rd)
        if rd.committed_entries:
            handler.apply(rd.committed_entries)
        if rd.messages:
            handler.send(rd.messages)
        handler.observe(rd)
        node.advance(rd)
        count += 1
    return count


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


def persist(writer: StorageWriter, rd: Ready) -> None:
    """The contract's first half, for the daemon's node and the simulations alike: make rd
    durable, the snapshot first, then hard state, entries and commit index in one write."""
    if rd.snapshot is not None:
        writer.install_snapshot(rd.snapshot)
    if rd.hard_state is not None or rd.entries:
        writer.save(rd.hard_state, rd.entries)


ProposeResult = Union[Proposed, NotLeader, Refused]
ReadResult = Union[ReadRequested, NotLeader]
