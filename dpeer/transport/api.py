"""The transport seam: what the node driver and the daemon need from the network.

Two implementations: gRPC (transport/grpc_transport.py, production) and an in-memory network
(transport/memory.py, the whole-cluster simulation). Faults (partitions, loss, delay) are a
wrapper (transport/faulty.py) that only the chaos tool and the simulation install.
"""

from __future__ import annotations

from typing import AsyncIterator, Callable, Protocol, Sequence

from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.security.auth import Vouch


class PeerClient(Protocol):
    """Request/response calls to one node; failures raise dpeer.errors.PeerError subclasses."""

    async def join(self, node_id: str, addr: str, store_port: int = 0, ready: bool = True,
                   uid: str = "", boot: str = "", up: float = 0.0, site: str = "",
                   near: Sequence[str] = ()) -> pb.JoinReply:
        """Ask the node to admit node_id (its store uid, its daemon's boot and that daemon's age)."""

    async def group_failed(self, request: pb.GroupFailedRequest) -> pb.GroupFailedReply:
        """Report a failed group (forwarded to the leader)."""

    async def report_checkpoint(self, node_id: str, step: int, digest: str,
                                final: bool = False) -> pb.CheckpointReply:
        """Report a held checkpoint (forwarded to the leader)."""

    async def kv_put(self, key: str, value: str, timeout: float | None = None) -> pb.KvPutReply:
        """Commit key=value through the node."""

    async def kv_get(self, key: str) -> pb.KvGetReply:
        """A linearizable read through the node."""

    async def leave(self, node_id: str = "", forwarded: bool = False) -> pb.LeaveReply:
        """Ask the node to leave, or (forwarded) commit node_id's leave on the leader."""

    async def force(self, voters: list[str]) -> pb.ForceReply:
        """The unsafe operator recovery."""

    def fetch_entries(self, from_index: int, to_index: int, node_id: str,
                      timeout: float = 30.0) -> AsyncIterator[pb.EntryChunk]:
        """Stream committed entries [from_index, to_index]."""

    def fetch_checkpoint(self, step: int, offset: int = 0, timeout: float = 120.0) -> AsyncIterator[pb.CheckpointChunk]:
        """Stream a checkpoint file."""


class Transport(Protocol):
    """One-way protocol envelopes to peers, and clients for request/response calls."""

    def send(self, addr: str, envelope: pb.Envelope) -> None:
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
