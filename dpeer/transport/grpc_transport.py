"""The production transport: peer envelopes over long-lived gRPC streams, calls over shared channels."""

from __future__ import annotations

from typing import Callable

from dpeer.security.auth import Vouch
from dpeer.transport import codec
from dpeer.transport.api import Envelope, Refused
from dpeer.transport.client import Channels, NodeClient, PeerSender
from dpeer.transport.options import Security


class GrpcTransport:
    """transport.api.Transport over gRPC: one PeerSender and one set of channels per daemon."""

    def __init__(self, security: Security, on_refused: Refused, *, timeout: float = 1.0,
                 on_rtt: Callable[[float], None] | None = None) -> None:
        self.channels = Channels(security)
        self.sender = PeerSender(self.channels, on_refused=on_refused, timeout=timeout, on_rtt=on_rtt)

    def send(self, addr: str, envelope: Envelope) -> None:
        """PeerSender.send, the envelope in its wire form."""
        self.sender.send(addr, codec.encode(envelope))

    def client(self, addr: str, timeout: float = 5.0, on_behalf_of: Vouch | None = None) -> NodeClient:
        """A NodeClient on the shared channels."""
        return NodeClient(addr, channels=self.channels, timeout=timeout, on_behalf_of=on_behalf_of)

    async def close(self) -> None:
        """Close the streams, then the channels."""
        await self.sender.close()
        await self.channels.close()
