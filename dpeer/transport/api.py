"""The transport seam: what the node driver and the daemon need from the network.

Written in the cores' messages (in an Envelope) and the calls' dataclasses (transport/calls.py):
the wire's protobuf stays inside the gRPC transport (codec.py, wire.py).

Two implementations: gRPC (transport/grpc_transport.py, production) and an in-memory network
(transport/memory.py, the whole-cluster simulation). Faults (partitions, loss, delay) are a
wrapper (transport/faulty.py) that only the chaos tool and the simulation install.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

from dpeer.consensus.messages import Peer
from dpeer.security.auth import Vouch
from dpeer.transport.calls import (
    CheckpointChunk,
    CheckpointReply,
    EntryChunk,
    ForceReply,
    GroupFailedReply,
    GroupFailedRequest,
    JoinReply,
    KvGetReply,
    KvPutReply,
    LeaveReply,
)

BOOT_DIGITS = 16  # a daemon's boot: 8 random bytes in lowercase hex
MAX_UP = 1e10  # seconds a daemon may claim to have run (about 300 years)


def valid_boot(boot: str) -> bool:
    """A daemon's boot as the wire carries it: BOOT_DIGITS lowercase hex digits, or empty (an older peer)."""
    return boot == "" or (len(boot) == BOOT_DIGITS and all(c in "0123456789abcdef" for c in boot))


@dataclass(frozen=True)
class Envelope:
    """One core message (membership or Raft) and its sender's header: its identity, address, the
    store uid a Raft message is meant for, and the sending daemon's boot and age in seconds."""

    msg: Any
    sender: Peer
    from_addr: str
    to_uid: str = ""
    boot: str = ""
    up: float = 0.0


class PeerClient(Protocol):
    """Request/response calls to one node; failures raise dpeer.errors.PeerError subclasses."""

    async def join(self, node_id: str, addr: str, store_port: int = 0, ready: bool = True,
                   uid: str = "", boot: str = "", up: float = 0.0, site: str = "",
                   near: Sequence[str] = (), speed_class: int | None = None) -> JoinReply:
        """Ask the node to admit node_id (its store uid, its daemon's boot and that daemon's age)."""

    async def group_failed(self, request: GroupFailedRequest) -> GroupFailedReply:
        """Report a failed group (forwarded to the leader)."""

    async def report_checkpoint(self, node_id: str, step: int, digest: str,
                                final: bool = False) -> CheckpointReply:
        """Report a held checkpoint (forwarded to the leader)."""

    async def kv_put(self, key: str, value: str, timeout: float | None = None) -> KvPutReply:
        """Commit key=value through the node."""

    async def kv_get(self, key: str) -> KvGetReply:
        """A linearizable read through the node."""

    async def leave(self, node_id: str = "", forwarded: bool = False) -> LeaveReply:
        """Ask the node to leave, or (forwarded) commit node_id's leave on the leader."""

    async def force(self, voters: list[str]) -> ForceReply:
        """The unsafe operator recovery."""

    def fetch_entries(self, from_index: int, to_index: int, node_id: str,
                      timeout: float = 30.0) -> AsyncIterator[EntryChunk]:
        """Stream committed entries [from_index, to_index]."""

    def fetch_checkpoint(self, step: int, offset: int = 0, timeout: float = 120.0) -> AsyncIterator[CheckpointChunk]:
        """Stream a checkpoint file."""


class Transport(Protocol):
    """One-way protocol envelopes to peers, and clients for request/response calls."""

    def send(self, addr: str, envelope: Envelope) -> None:
        """Queue one envelope to addr; lost like a datagram when it cannot go."""

    def client(self, addr: str, timeout: float = 5.0, on_behalf_of: Vouch | None = None) -> PeerClient:
        """A client for calls to the node at addr (on_behalf_of: the caller a node forwards for)."""

    async def close(self) -> None:
        """Stop sending and close every connection."""


Refused = Callable[[str], None]
"""Told the address of a peer whose port refused a connection (its process is gone)."""
TransportFactory = Callable[[Refused], Transport]
"""Builds a daemon's transport, given where refusals go."""
Verdict = Callable[[str], "float | None"]
"""A fault policy: None to drop the envelope to addr, else the seconds to hold it first."""
