"""A transport wrapper that drops or holds outgoing envelopes as a fault policy says.

Only the chaos tool's daemon entry (dpeer/chaos/daemon.py) installs it; `dpeer start` sends
through the bare transport. Scope: the one-way envelopes of the control plane (gossip, Raft);
request/response calls pass untouched (see dpeer/chaos/faults.py).
"""

from __future__ import annotations

import asyncio

from dpeer.security.auth import Vouch
from dpeer.transport.api import Envelope, PeerClient, Transport, Verdict


class FaultyTransport:
    """transport.api.Transport: `inner`, with each envelope's fate decided by `verdict(addr)`."""

    def __init__(self, inner: Transport, verdict: Verdict) -> None:
        self.inner, self._verdict = inner, verdict
        self.dropped = self.delayed = 0

    def send(self, addr: str, envelope: Envelope) -> None:
        """Drop, hold, or pass the envelope on."""
        delay = self._verdict(addr)
        if delay is None:
            self.dropped += 1
        elif delay > 0:
            self.delayed += 1
            asyncio.get_running_loop().call_later(delay, self.inner.send, addr, envelope)
        else:
            self.inner.send(addr, envelope)

    def client(self, addr: str, timeout: float = 5.0, on_behalf_of: Vouch | None = None) -> PeerClient:
        """The inner transport's client (calls are not faulted)."""
        return self.inner.client(addr, timeout, on_behalf_of)

    async def close(self) -> None:
        """Close the inner transport."""
        await self.inner.close()
