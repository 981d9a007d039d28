"""SWIM + Lifeguard membership and failure detection as a pure core (docs/architecture.md, "Layers")."""

from dpeer.membership.config import MembershipConfig, edge, lan, preset, wan
from dpeer.membership.core import Datagram, Membership
from dpeer.membership.effects import (
    Effect,
    HeartbeatObserved,
    SeenAlive,
    MemberChanged,
    SeenDead,
    SeenLeft,
    SeenSuspect,
)
from dpeer.membership.messages import (
    Ack,
    Gossip,
    Heartbeat,
    InvalidMessage,
    MemberRecord,
    MemberState,
    Message,
    Nack,
    Ping,
    PingReq,
    PushPull,
    Update,
    wire_size,
)

__all__ = [
    "Ack", "Datagram", "Effect", "Gossip", "Heartbeat", "HeartbeatObserved", "InvalidMessage", "SeenAlive",
    "MemberChanged", "SeenDead", "SeenLeft", "MemberRecord", "MemberState", "SeenSuspect", "Membership",
    "MembershipConfig", "Message", "Nack", "Ping", "PingReq", "PushPull", "Update",
    "edge", "lan", "preset", "wan", "wire_size",
]
