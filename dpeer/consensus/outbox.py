"""Outbox: the messages a RaftNode queued for its next Ready, each addressed to a member's store.

Requests go to the store uid the configuration in force names for the member; a reply goes to
the store that sent the message being stepped, whatever the configuration says of it.
"""

from __future__ import annotations

from typing import Any, Callable

from dpeer.consensus.messages import Peer
from dpeer.consensus.ready import Outgoing


class Outbox:
    """Queued messages (`msgs`) and the sender of the message being stepped (`peer`)."""

    def __init__(self, uid_of: Callable[[str], str | None]) -> None:
        self.uid_of = uid_of  # the store uid the configuration in force names for a member
        self.msgs: list[Outgoing] = []
        self.peer: Peer | None = None

    def send(self, dst: str, msg: Any) -> None:
        """Queue msg for member dst, meant for the store uid the configuration names for it."""
        uid = self.uid_of(dst)
        if uid is not None:
            self.msgs.append(Outgoing(dst, uid, msg))

    def reply(self, msg: Any) -> None:
        """Queue msg for the sender of the message being stepped, meant for its store."""
        assert self.peer is not None
        self.msgs.append(Outgoing(self.peer.node_id, self.peer.uid, msg))

    def to(self, peer: Peer, msg: Any) -> None:
        """Queue msg for peer's own store (an answer to a node the configuration may not name)."""
        self.msgs.append(Outgoing(peer.node_id, peer.uid, msg))

    def take(self) -> list[Outgoing]:
        """Hand the queued messages over (to a Ready) and start afresh."""
        msgs, self.msgs = self.msgs, []
        return msgs
