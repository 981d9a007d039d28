"""Commands through the leader: run here when this node leads, else on the leader in the name of
the caller this node authenticated; tried again across a leader change until COMMAND_TIMEOUT."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

from dpeer.consensus import Role
from dpeer.daemon.node.driver import Node
from dpeer.errors import Unavailable, Unreachable
from dpeer.security import auth
from dpeer.transport.api import PeerClient, Transport

T = TypeVar("T")
COMMAND_TIMEOUT = 10.0
# A command forwarded to a leader that is gone (or not yet known) is tried again this often,
# re-reading who leads, until COMMAND_TIMEOUT: a leader change costs a retry, not an error.
FORWARD_RETRY = 0.1


class Forwarder:
    """The service's way to the leader; see the module docstring."""

    def __init__(self, node: Node, transport: Transport) -> None:
        self.node, self.transport = node, transport

    def _leader_client(self) -> PeerClient:
        leader = self.node.leader_id
        addr = self.node.addrs.get(leader) if leader else None
        if addr is None or leader == self.node.id:
            raise Unavailable("no leader is known right now (election under way or no quorum); try again")
        # the caller this node authenticated travels along: the leader judges the command as theirs
        return self.transport.client(addr, timeout=COMMAND_TIMEOUT, on_behalf_of=auth.vouch(auth.CALLER.get()))

    async def via_leader(self, here: Callable[[], Awaitable[T]], there: Callable[[PeerClient], Awaitable[T]]) -> T:
        """Run a command here when this node leads, else on the leader. While no leader is known,
        or the one known is unreachable (it just left or died), try again until COMMAND_TIMEOUT."""
        deadline = self.node.clock() + COMMAND_TIMEOUT
        while True:
            try:
                return await (here() if self.node.role is Role.LEADER else there(self._leader_client()))
            except (Unavailable, Unreachable):
                if self.node.clock() + FORWARD_RETRY >= deadline:
                    raise
            await asyncio.sleep(FORWARD_RETRY)

    async def retry(self, attempt: Callable[[], Awaitable[str | None]], failure: str) -> None:
        """Run attempt every FORWARD_RETRY until it returns None (done); Unavailable('failure: reason')
        when it still returns a reason once COMMAND_TIMEOUT has passed."""
        deadline = self.node.clock() + COMMAND_TIMEOUT
        while (why := await attempt()) is not None:
            if self.node.clock() + FORWARD_RETRY >= deadline:
                raise Unavailable(f"{failure}: {why}")
            await asyncio.sleep(FORWARD_RETRY)
