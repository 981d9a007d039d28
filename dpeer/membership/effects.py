"""Effects the core hands to its daemon: member state changes and heartbeat observations.

A state change is a MemberChanged whose `state` is the MemberState the member moved to; the
subclasses name the four kinds for readers that match on type (alive carries the address).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dpeer.membership.messages import Heartbeat, MemberState


@dataclass(frozen=True, slots=True)
class MemberChanged:
    """A member moved to `state` at `incarnation`."""

    state: ClassVar[MemberState]
    node_id: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class SeenAlive(MemberChanged):
    """A member joined, or came back with a higher incarnation, at `addr`."""

    state: ClassVar[MemberState] = MemberState.ALIVE
    addr: str


@dataclass(frozen=True, slots=True)
class SeenSuspect(MemberChanged):
    """A member missed its probes (or refused a connection) and may be dead."""

    state: ClassVar[MemberState] = MemberState.SUSPECT
    # we saw its connection refused ourselves (nothing listens there: its process is gone); a
    # refusal only heard of through gossip is not set here, so one peer's reset cannot make
    # every voter drop a live leader's lease at once. A suspicion gossip brought first is told
    # again, with this set, when our own connection to the member is refused later
    refused: bool = False


@dataclass(frozen=True, slots=True)
class SeenDead(MemberChanged):
    """A suspicion expired unrefuted: the member is declared dead."""

    state: ClassVar[MemberState] = MemberState.DEAD


@dataclass(frozen=True, slots=True)
class SeenLeft(MemberChanged):
    """A member left gracefully."""

    state: ClassVar[MemberState] = MemberState.LEFT


@dataclass(frozen=True, slots=True)
class HeartbeatObserved:
    """A member's versioned heartbeat arrived (input to resync planning); `at` is our clock."""

    hb: Heartbeat
    at: float


Effect = MemberChanged | HeartbeatObserved
