"""Effects the core hands to its daemon: member state changes and heartbeat observations."""

from __future__ import annotations

from dataclasses import dataclass

from dpeer.membership.messages import Heartbeat


@dataclass(frozen=True, slots=True)
class MemberAlive:
    """A member joined, or came back with a higher incarnation."""

    node_id: str
    addr: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class MemberSuspect:
    """A member missed its probes (or refused a connection) and may be dead."""

    node_id: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class MemberDead:
    """A suspicion expired unrefuted: the member is declared dead."""

    node_id: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class MemberLeft:
    """A member left gracefully."""

    node_id: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class HeartbeatObserved:
    """A member's versioned heartbeat arrived (input to resync planning); `at` is our clock."""

    hb: Heartbeat
    at: float


Effect = MemberAlive | MemberSuspect | MemberDead | MemberLeft | HeartbeatObserved
