"""A training group's view: the one type a generation's membership takes from the log to the worker.

The leader proposes it, the log commits it (its payload keeps the store address as text), the
daemon hands it to its worker through the channel (channel.local.Assignment adds where to resume
and which address to bind), and the worker forms its group from it. Each member's site (where the
box stands, daemon/decide/sites.py) comes with it, and each member's share of a step (`share_counts`
says how many units that is, alike for the leader's plan and the worker's split). Pure: imports only
Address.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from dpeer.address import Address

MAX_SHARE = 64  # the largest weight a view gives a member's share of a step (the smallest is 1)
_SITE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


def valid_shares(shares: tuple[int, ...], members: int) -> bool:
    """Whether `shares` may stand as a view's shares for `members` members: none (even shares), or
    one integer weight from 1 to MAX_SHARE a member."""
    return shares == () or (len(shares) == members and all(type(s) is int and 1 <= s <= MAX_SHARE for s in shares))


def share_counts(total: int, shares: Sequence[int]) -> list[int]:
    """How many of ``total`` items each rank gets by its weight in ``shares``: the floors of the exact
    shares, the rest one each to the largest remainders (the lower rank first on a tie), so equal
    weights split as evenly as shard_bounds does. While there are as many items as ranks, every
    rank gets one at least (taken from a rank with the most: of several, the one of the least
    weight, the higher rank on a tie, so a heavier rank never ends with fewer items than a lighter
    one): a box given none would measure no speed and keep its old, slow class for good."""
    if not shares or any(type(s) is not int or s < 1 for s in shares):
        raise ValueError(f"shares must be positive integers, got {list(shares)}")
    weight = sum(shares)
    counts = [total * s // weight for s in shares]
    by_remainder = sorted(range(len(shares)), key=lambda r: (-(total * shares[r] % weight), r))
    for r in by_remainder[: total - sum(counts)]:
        counts[r] += 1
    if total >= len(shares):
        for r in [r for r, c in enumerate(counts) if c == 0]:
            most = max(counts)
            giver = min((i for i, c in enumerate(counts) if c == most), key=lambda i: (shares[i], -i))
            counts[giver] -= 1
            counts[r] = 1
    return counts


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
