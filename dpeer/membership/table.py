"""The members table: one row per known node, plus the indexes the core needs in O(1)
(by address for refused connections, a dense id list for random choice, a live count for N)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Iterator

from dpeer.membership.messages import MemberRecord, MemberState
from dpeer.membership.suspicion import Suspicion

LIVE = (MemberState.ALIVE, MemberState.SUSPECT)


@dataclass(slots=True)
class MemberRow:
    """What we know of one other node: state, incarnation and its last versioned heartbeat."""

    node_id: str
    addr: str
    state: MemberState
    incarnation: int
    changed_at: float
    term: int = 0
    last_applied: int = 0
    commit_index: int = 0
    suspicion: Suspicion | None = None

    def record(self) -> MemberRecord:
        """This row as a push-pull record."""
        return MemberRecord(
            self.node_id, self.addr, self.state, self.incarnation, self.term, self.last_applied, self.commit_index
        )


class MemberTable:
    """Members by id, with an address index, a dense id list and a count of live members."""

    def __init__(self) -> None:
        self._by_id: dict[str, MemberRow] = {}
        self._by_addr: dict[str, str] = {}
        self._ids: list[str] = []
        self._pos: dict[str, int] = {}
        self.live = 0

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[MemberRow]:
        return iter(self._by_id.values())

    def get(self, node_id: str) -> MemberRow | None:
        """The member with this id, if known."""
        return self._by_id.get(node_id)

    def by_addr(self, addr: str) -> MemberRow | None:
        """The member last seen at this address, if any."""
        node_id = self._by_addr.get(addr)
        return None if node_id is None else self._by_id.get(node_id)

    def add(self, member: MemberRow) -> None:
        """Insert a new member."""
        self._by_id[member.node_id] = member
        self._by_addr[member.addr] = member.node_id
        self._pos[member.node_id] = len(self._ids)
        self._ids.append(member.node_id)
        self.live += member.state in LIVE

    def remove(self, node_id: str) -> None:
        """Forget a member (reaping), in O(1)."""
        member = self._by_id.pop(node_id)
        if self._by_addr.get(member.addr) == node_id:
            del self._by_addr[member.addr]
        pos = self._pos.pop(node_id)
        last = self._ids.pop()
        if last != node_id:
            self._ids[pos] = last
            self._pos[last] = pos
        self.live -= member.state in LIVE

    def set_state(self, member: MemberRow, state: MemberState, now: float) -> None:
        """Change a member's state, keeping the live count."""
        self.live += (state in LIVE) - (member.state in LIVE)
        member.state = state
        member.changed_at = now

    def set_addr(self, member: MemberRow, addr: str) -> None:
        """Move a member to a new address."""
        if self._by_addr.get(member.addr) == member.node_id:
            del self._by_addr[member.addr]
        member.addr = addr
        self._by_addr[addr] = member.node_id

    def ids(self) -> list[str]:
        """Every known id (a copy)."""
        return list(self._ids)

    def sample(self, rng: random.Random, k: int, accept: Callable[[MemberRow], bool]) -> list[MemberRow]:
        """Up to k distinct random members passing `accept`; exact for small tables, O(k) otherwise."""
        if len(self._ids) <= 4 * k + 16:
            pool = [m for m in self._by_id.values() if accept(m)]
            return rng.sample(pool, min(k, len(pool)))
        chosen: dict[str, MemberRow] = {}
        for _ in range(8 * k + 32):
            member = self._by_id[self._ids[rng.randrange(len(self._ids))]]
            if member.node_id not in chosen and accept(member):
                chosen[member.node_id] = member
                if len(chosen) == k:
                    break
        return list(chosen.values())


class ProbeOrder:
    """Randomised round-robin over members (memberlist): every member is probed once per pass."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._ids: list[str] = []
        self._at = 0

    def insert(self, node_id: str) -> None:
        """A new member goes to a random place among those not yet probed in this pass."""
        self._ids.insert(self._rng.randint(self._at, len(self._ids)), node_id)

    def next(self, table: MemberTable, now: float, reap_after: float) -> MemberRow | None:
        """The next live member to probe; at the end of a pass, reap old dead members and reshuffle."""
        for _ in range(len(self._ids) + 1):
            if self._at >= len(self._ids):
                self._reset(table, now, reap_after)
                if not self._ids:
                    return None
            member = table.get(self._ids[self._at])
            self._at += 1
            if member is not None and member.state in LIVE:
                return member
        return None

    def _reset(self, table: MemberTable, now: float, reap_after: float) -> None:
        for member in list(table):
            if member.state not in LIVE and now - member.changed_at >= reap_after:
                table.remove(member.node_id)
        self._ids = table.ids()
        self._rng.shuffle(self._ids)
        self._at = 0
