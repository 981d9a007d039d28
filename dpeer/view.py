"""A training group's view: the one type a generation's membership takes from the log to the worker.

The leader proposes it, the log commits it (its payload keeps the store address as text), the
daemon hands it to its worker through the channel (channel.local.Assignment adds where to resume
and which address to bind), and the worker forms its group from it. Pure: imports only Address.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpeer.address import Address


@dataclass(frozen=True, slots=True)
class View:
    """One generation's group: its members in rank order, the rendezvous store that the worker of
    ``members[0]`` hosts, and the random secret the leader drew for the generation's rendezvous
    and heal keys ("" when none was drawn)."""

    generation: int
    members: tuple[str, ...]
    store: Address
    secret: str = ""

    def rank_of(self, node_id: str) -> int | None:
        """This node's rank in the view, or None when it is not a member."""
        return self.members.index(node_id) if node_id in self.members else None
