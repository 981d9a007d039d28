"""A training group's view: the one type a generation's membership takes from the log to the worker.

The leader proposes it, the log commits it (its payload keeps the store address as text), the
daemon hands it to its worker through the channel (channel.local.Assignment adds where to resume
and which address to bind), and the worker forms its group from it. Each member's site (where the
box stands, daemon/decide/sites.py) comes with it. Pure: imports only Address.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpeer.address import Address

MAX_SHARE = 64  # the largest weight a view gives a member's share of a step (the smallest is 1)
_SITE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


def valid_shares(shares: tuple[int, ...], members: int) -> bool:
    """Whether `shares` may stand as a view's shares for `members` members: none (even shares), or
    one integer weight from 1 to MAX_SHARE a member."""
    return shares == () or (len(shares) == members and all(type(s) is int and 1 <= s <= MAX_SHARE for s in shares))


def valid_site(name: str) -> bool:
    """Whether `name` may stand as a site in a view or a member record: 1-80 letters, digits, '.',
    '_' or '-', starting with a letter or digit."""
    return type(name) is str and bool(_SITE.fullmatch(name))


@dataclass(frozen=True, slots=True)
class View:
    """One generation's group: its members in rank order, the rendezvous store that the worker of
    ``members[0]`` hosts, the random secret the leader drew for the generation's rendezvous
    and heal keys ("" when none was drawn), each member's site in rank order (empty when the
    leader named none: an older leader), and each member's share of a step's work in rank order
    (positive weights, MAX_SHARE at most; empty: even shares, as before shares existed)."""

    generation: int
    members: tuple[str, ...]
    store: Address
    secret: str = ""
    sites: tuple[str, ...] = ()
    shares: tuple[int, ...] = ()

    def rank_of(self, node_id: str) -> int | None:
        """This node's rank in the view, or None when it is not a member."""
        return self.members.index(node_id) if node_id in self.members else None

    def site_of(self, node_id: str) -> str | None:
        """The site the view places `node_id` in, or None when it names none for it."""
        rank = self.rank_of(node_id)
        return self.sites[rank] if rank is not None and rank < len(self.sites) else None
