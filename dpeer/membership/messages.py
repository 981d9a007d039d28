"""Wire messages of the membership protocol: frozen dataclasses, their validation and size.

The gRPC transport maps each class to a protobuf message and calls `validate()` on receipt, so
a malformed or hostile peer is rejected before the pure core sees anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from dpeer.address import Address

MAX_NODE_ID = 64
MAX_ADDR = 261  # a 253-character DNS name, ':' and a 5-digit port
MAX_UPDATES = 64
MAX_RECORDS = 10_000
MAX_COUNTER = 2**63 - 1


class MemberState(StrEnum):
    """What a node believes about a member; also the kind of a gossiped update."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


class InvalidMessage(ValueError):
    """A message field is absurd; the transport drops the message."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The sender's versioned heartbeat, carried by every message (docs/architecture.md)."""

    node_id: str
    addr: str
    incarnation: int
    term: int
    last_applied: int
    commit_index: int
    sent_at: float

    def validate(self) -> None:
        """Reject absurd identity, address, counters or timestamp."""
        _node_id(self.node_id)
        _addr(self.addr)
        for name in ("incarnation", "term", "last_applied", "commit_index"):
            _counter(name, getattr(self, name))
        if not math.isfinite(self.sent_at) or self.sent_at < 0:
            raise InvalidMessage(f"sent_at must be a finite non-negative time, got {self.sent_at!r}")


@dataclass(frozen=True, slots=True)
class Update:
    """One piggybacked membership change: `node_id` is `state` at `incarnation`, says `origin`.

    `refused` marks a suspicion backed by a refused connection (strong evidence of death).
    """

    state: MemberState
    node_id: str
    addr: str
    incarnation: int
    origin: str
    refused: bool = False

    def validate(self) -> None:
        """Reject an unknown state, bad ids or address, a negative incarnation."""
        if not isinstance(self.state, MemberState):
            raise InvalidMessage(f"unknown member state {self.state!r}")
        _node_id(self.node_id)
        _node_id(self.origin)
        _addr(self.addr)
        _counter("incarnation", self.incarnation)


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One row of a full state exchange (push-pull) or of a bootstrap member list."""

    node_id: str
    addr: str
    state: MemberState
    incarnation: int
    term: int = 0
    last_applied: int = 0
    commit_index: int = 0

    def validate(self) -> None:
        """Reject bad ids, address, state or counters."""
        if not isinstance(self.state, MemberState):
            raise InvalidMessage(f"unknown member state {self.state!r}")
        _node_id(self.node_id)
        _addr(self.addr)
        for name in ("incarnation", "term", "last_applied", "commit_index"):
            _counter(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class Ping:
    """A direct probe of `target` (a node id, so a reused address is not mistaken for it)."""

    seq: int
    target: str
    hb: Heartbeat
    updates: tuple[Update, ...] = ()

    def validate(self) -> None:
        """Check every field and the piggyback count."""
        _counter("seq", self.seq)
        _node_id(self.target)
        _envelope(self.hb, self.updates)


@dataclass(frozen=True, slots=True)
class Ack:
    """Answer to a Ping; `hb` is the probed node's heartbeat, also when relayed for a PingReq."""

    seq: int
    hb: Heartbeat
    updates: tuple[Update, ...] = ()

    def validate(self) -> None:
        """Check every field and the piggyback count."""
        _counter("seq", self.seq)
        _envelope(self.hb, self.updates)


@dataclass(frozen=True, slots=True)
class PingReq:
    """Ask the receiver to probe `target` at `target_addr` for us and relay the ack (or a nack)."""

    seq: int
    target: str
    target_addr: str
    hb: Heartbeat
    updates: tuple[Update, ...] = ()

    def validate(self) -> None:
        """Check every field and the piggyback count."""
        _counter("seq", self.seq)
        _node_id(self.target)
        _addr(self.target_addr)
        _envelope(self.hb, self.updates)


@dataclass(frozen=True, slots=True)
class Nack:
    """A relay could not reach the target in time: it is alive, so our own health is fine."""

    seq: int
    hb: Heartbeat

    def validate(self) -> None:
        """Check every field."""
        _counter("seq", self.seq)
        self.hb.validate()


@dataclass(frozen=True, slots=True)
class Gossip:
    """Queued updates pushed to a few random members every gossip interval."""

    hb: Heartbeat
    updates: tuple[Update, ...] = ()

    def validate(self) -> None:
        """Check every field and the piggyback count."""
        _envelope(self.hb, self.updates)


@dataclass(frozen=True, slots=True)
class PushPull:
    """Anti-entropy: the sender's whole table; the receiver merges it and, unless `reply`, answers.

    `join` marks the first exchange of a joining node with a seed.
    """

    hb: Heartbeat
    members: tuple[MemberRecord, ...]
    join: bool = False
    reply: bool = False

    def validate(self) -> None:
        """Check the heartbeat and every record; bound the table size."""
        self.hb.validate()
        if len(self.members) > MAX_RECORDS:
            raise InvalidMessage(f"push-pull carries {len(self.members)} records, at most {MAX_RECORDS}")
        for record in self.members:
            record.validate()


Message = Ping | Ack | PingReq | Nack | Gossip | PushPull
Datagram = tuple[str, Message]  # (address, message): what the core hands its caller to send

_HB_BYTES = 40  # ids and addresses are added per message
_UPDATE_BYTES = 14
_RECORD_BYTES = 22
_FRAME_BYTES = 12  # message type, seq, framing


def wire_size(msg: Message) -> int:
    """Approximate encoded size in bytes (protobuf-like varints), for byte accounting."""
    size = _FRAME_BYTES + _hb_size(msg.hb)
    if isinstance(msg, PushPull):
        return size + sum(_RECORD_BYTES + len(r.node_id) + len(r.addr) for r in msg.members)
    if isinstance(msg, (Ping, PingReq)):
        size += len(msg.target)
    if isinstance(msg, PingReq):
        size += len(msg.target_addr)
    updates = getattr(msg, "updates", ())
    return size + sum(_UPDATE_BYTES + len(u.node_id) + len(u.addr) + len(u.origin) for u in updates)


def _hb_size(hb: Heartbeat) -> int:
    return _HB_BYTES + len(hb.node_id) + len(hb.addr)


def _envelope(hb: Heartbeat, updates: tuple[Update, ...]) -> None:
    hb.validate()
    if len(updates) > MAX_UPDATES:
        raise InvalidMessage(f"{len(updates)} piggybacked updates, at most {MAX_UPDATES}")
    for update in updates:
        update.validate()


def _node_id(value: str) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_NODE_ID or not value.isprintable():
        raise InvalidMessage(f"node id must be 1-{MAX_NODE_ID} printable characters, got {value!r}")


def _addr(value: str) -> None:
    if not isinstance(value, str) or len(value) > MAX_ADDR:
        raise InvalidMessage(f"address must be host:port of at most {MAX_ADDR} characters, got {value!r}")
    try:
        host, _ = Address.parse(value)
    except ValueError as exc:
        raise InvalidMessage(f"address must be host:port with a port in 1-65535: {exc}") from None
    if not host.isprintable() or " " in host:
        raise InvalidMessage(f"address must be host:port, got {value!r}")


def _counter(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNTER:
        raise InvalidMessage(f"{name} must be an integer in [0, 2^63), got {value!r}")
