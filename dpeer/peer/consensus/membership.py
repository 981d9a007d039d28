"""The voting configuration: voters (who elect and commit) and learners (who only replicate).

A configuration lives in the log as a config_change entry holding the whole new set; it takes
effect on every node as soon as it is appended (Raft dissertation, section 4.1), so each change
may move only one node (single-server changes keep old and new majorities overlapping).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Mapping

from dpeer.statemachine.entry import Entry, EntryKind


class MembershipError(ValueError):
    """A requested change is not a single-server change, breaks the voter cap, or is a no-op."""


class ChangeOp(str, Enum):
    """The single-server changes a leader accepts."""

    ADD_LEARNER = "add_learner"
    ADD_VOTER = "add_voter"
    PROMOTE = "promote"
    REMOVE = "remove"


@dataclass(frozen=True)
class Membership:
    """Voters and learners, disjoint; an empty voter set means 'not yet part of a cluster'."""

    voters: frozenset[str] = frozenset()
    learners: frozenset[str] = frozenset()

    @classmethod
    def of(cls, voters: Iterable[str], learners: Iterable[str] = ()) -> Membership:
        """Build from any iterables; raises MembershipError when a node is both voter and learner."""
        m = cls(frozenset(voters), frozenset(learners))
        if m.voters & m.learners:
            raise MembershipError(f"nodes both voter and learner: {sorted(m.voters & m.learners)}")
        return m

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Membership:
        """Read a config_change entry's payload {'voters': [...], 'learners': [...]}."""
        return cls.of(payload["voters"], payload.get("learners", ()))

    def to_payload(self) -> dict[str, Any]:
        """The config_change payload, with sorted lists so every node writes identical bytes."""
        return {"voters": sorted(self.voters), "learners": sorted(self.learners)}

    @property
    def quorum(self) -> int:
        """Votes (or acknowledgements) needed from voters: a strict majority."""
        return len(self.voters) // 2 + 1

    @property
    def members(self) -> frozenset[str]:
        """Every node that replicates the log."""
        return self.voters | self.learners

    def changed(self, op: ChangeOp, node: str, max_voters: int) -> Membership:
        """The configuration after one single-server change; raises MembershipError if invalid."""
        v, l = set(self.voters), set(self.learners)
        if op is ChangeOp.ADD_LEARNER and node not in self.members:
            l.add(node)
        elif op is ChangeOp.ADD_VOTER and node not in self.members:
            v.add(node)
        elif op is ChangeOp.PROMOTE and node in self.learners:
            l.discard(node)
            v.add(node)
        elif op is ChangeOp.REMOVE and node in self.members:
            v.discard(node)
            l.discard(node)
        else:
            raise MembershipError(f"{op.value} {node!r} does not apply to {self.to_payload()}")
        if len(v) > max_voters:
            raise MembershipError(f"voter cap {max_voters} reached; add {node!r} as a learner")
        if not v:
            raise MembershipError("a configuration needs at least one voter")
        return Membership.of(v, l)


def bootstrap(storage: Any, voters: Iterable[str], learners: Iterable[str] = ()) -> None:
    """Found a cluster on an empty storage: a committed config_change entry at index 1, term 1.

    Every founding member runs this with the same sets, so their logs start identical (etcd does
    the same); nodes that join later start empty and learn the configuration from the leader.
    """
    if storage.last_index != 0 or storage.snapshot_index != 0:
        raise MembershipError("bootstrap needs an empty storage")
    conf = Membership.of(voters, learners)
    if not conf.voters:
        raise MembershipError("bootstrap needs at least one voter")
    storage.set_hard_state(1, None)
    storage.append([Entry(1, 1, EntryKind.CONFIG_CHANGE, conf.to_payload())])
    storage.set_commit(1)
