"""Safety invariants of the Raft simulations, fed by every persisted Ready and applied entry.

- State Machine Safety: every two stores agree on every committed index they both hold, and a
  store never changes an entry it committed. A store wiped away (its disk replaced) is
  forgotten: the check is over the stores that exist, crashed ones included.
- Election Safety: at most one leader per term.
- Leader Completeness: a new leader holds every entry committed in an earlier term.
- The minority side of a partition commits nothing new; two views never share a generation.
"""

from __future__ import annotations

from typing import Any, Hashable

from dpeer.consensus import RaftNode, Ready, Role
from dpeer.statemachine.entry import Entry


def key(e: Entry) -> tuple[int, str, Any]:
    """What must be equal for two entries at one index to be the same entry."""
    return (e.term, e.kind.value, repr(sorted(e.payload.items())))


class Holders:
    """For each slot (a log index, a view generation), which stores hold which value there."""

    def __init__(self) -> None:
        self._at: dict[Hashable, dict[Any, set[str]]] = {}

    def add(self, slot: Hashable, value: Any, node: str) -> Any:
        """Record that node holds value at slot; returns another value a live store holds there,
        or None when they agree."""
        held = self._at.setdefault(slot, {})
        held.setdefault(value, set()).add(node)
        return next((v for v, nodes in held.items() if v != value and nodes), None)

    def value_of(self, slot: Hashable, node: str) -> Any:
        """The value node holds at slot, or None."""
        return next((v for v, nodes in self._at.get(slot, {}).items() if node in nodes), None)

    def live(self) -> dict[Hashable, Any]:
        """slot -> the value the existing stores hold (one per slot while the invariant holds)."""
        return {s: v for s, held in self._at.items() for v, nodes in held.items() if nodes}

    def forget(self, node: str) -> None:
        """node's store is gone (wiped): it holds nothing any more."""
        for held in self._at.values():
            for nodes in held.values():
                nodes.discard(node)


class Checker:
    """Raises AssertionError naming the violation at the Ready or apply that caused it."""

    def __init__(self, quorum: int) -> None:
        self.quorum = quorum
        self.leaders: dict[int, str] = {}
        self.committed = Holders()
        self.commit_term: dict[tuple[int, Any], int] = {}  # an upper bound of the term each entry committed in
        self.views = Holders()
        self.seen_commit: dict[str, int] = {}
        self.minority: set[str] = set()
        self.minority_cap = 0
        self.outside: dict[int, set[int]] = {}  # (index -> terms) stored outside the minority
        self.readies = 0

    def forget(self, nid: str) -> None:
        """nid restarts on a new, empty disk: what its old store committed is gone with it."""
        self.committed.forget(nid)
        self.views.forget(nid)
        self.seen_commit.pop(nid, None)

    def on_ready(self, nid: str, node: RaftNode, rd: Ready) -> None:
        """Check one persisted Ready of node nid."""
        self.readies += 1
        if node.role is Role.LEADER and self.leaders.setdefault(node.term, nid) != nid:
            raise AssertionError(f"two leaders in term {node.term}: {self.leaders[node.term]}, {nid}")
        for e in rd.entries:
            mine = self.committed.value_of(e.index, nid)
            if mine is not None and mine != key(e):
                raise AssertionError(f"{nid} overwrote its committed entry {e.index} ({mine}) with {e}")
        if rd.soft_state is not None and node.role is Role.LEADER:
            self._check_leader_completeness(nid, node)
        self._check_commits(nid, node)

    def _check_leader_completeness(self, nid: str, node: RaftNode) -> None:
        for i, k in self.committed.live().items():
            late = self.commit_term[(i, k)] < node.term  # leader completeness covers only these
            if late and i >= node.log.first_index() and node.log.term(i) != k[0]:
                raise AssertionError(f"new leader {nid} (term {node.term}) lacks committed {i}")

    def _check_commits(self, nid: str, node: RaftNode) -> None:
        commit, prev = node.commit_index, self.seen_commit.get(nid, 0)
        lo = max(prev + 1, node.log.first_index())
        for e in node.log.slice(lo, commit + 1, 1 << 62) if lo <= commit else []:
            if nid in self.minority and e.index > self.minority_cap and \
                    e.term not in self.outside.get(e.index, ()):
                raise AssertionError(f"{nid} on the minority side committed new entry {e}")
            self.commit_term.setdefault((e.index, key(e)), node.term)
            other = self.committed.add(e.index, key(e), nid)
            if other is not None:
                raise AssertionError(f"{nid} committed {e} but {other} was committed at {e.index}")
        self.seen_commit[nid] = max(prev, commit)

    def on_apply(self, nid: str, entry: Entry, effective_view: bool) -> None:
        """Check one applied entry: it is the entry nid committed, and views stay unique."""
        mine = self.committed.value_of(entry.index, nid)
        if mine is not None and mine != key(entry):
            raise AssertionError(f"{nid} applied {entry}, but committed {mine} there")
        if effective_view:
            gen, members = entry.payload["generation"], tuple(entry.payload["members"])
            other = self.views.add(gen, members, nid)
            if other is not None:
                raise AssertionError(f"two views with generation {gen}: {other}, {members}")
