"""The voting configuration: voters (who elect and commit) and learners (who only replicate).

A configuration lives in the log as a config_change entry holding the whole new set; it takes
effect on every node as soon as it is appended (Raft dissertation, section 4.1), so each change
may move only one node (single-server changes keep old and new majorities overlapping).

A member is its node id plus the uid of its store (drawn when the store was created): a box
that lost its disk comes back under its old node id with a new uid, and is not the member the
configuration names (it never votes or acknowledges as it) until a leader replaced the old
member by the new one. The epoch counts forced reconfigurations: a voter of an older epoch
belongs to a cluster that an operator gave up on.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Iterable, Mapping

from dpeer.consensus.entry import Entry, RaftKind
from dpeer.ids import valid_uid


class ConfigChangeError(ValueError):
    """A requested change is not a single-server change, breaks the voter cap, or is a no-op."""


class ChangeOp(StrEnum):
    """The single-server changes a leader accepts."""

    ADD_LEARNER = "add_learner"
    ADD_VOTER = "add_voter"
    PROMOTE = "promote"
    REMOVE = "remove"


@dataclass(frozen=True)
class VotingConfig:
    """Voters and learners, disjoint, each with its store uid (`uids`: sorted (node, uid) pairs),
    the cluster epoch (1 when founded, +1 per forced reconfiguration) and when the last force
    happened (unix seconds, 0.0 if never). An empty voter set means 'not yet part of a cluster'."""

    voters: frozenset[str] = frozenset()
    learners: frozenset[str] = frozenset()
    uids: tuple[tuple[str, str], ...] = ()
    epoch: int = 0
    forced_at: float = 0.0

    @classmethod
    def of(cls, voters: Iterable[str], learners: Iterable[str], uids: Mapping[str, str], epoch: int = 1,
           forced_at: float = 0.0) -> VotingConfig:
        """Build from any iterables; raises ConfigChangeError when a node is both voter and learner
        or a member lacks a valid uid."""
        v, l = frozenset(voters), frozenset(learners)
        if v & l:
            raise ConfigChangeError(f"nodes both voter and learner: {sorted(v & l)}")
        if set(uids) != v | l or not all(valid_uid(u) for u in uids.values()):
            raise ConfigChangeError(f"every member needs one store uid (32 hex digits): {dict(uids)}")
        if epoch < 1:
            raise ConfigChangeError(f"epoch must be >= 1, got {epoch}")
        return cls(v, l, tuple(sorted(uids.items())), epoch, forced_at)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> VotingConfig:
        """Read a config_change entry's payload (see to_payload)."""
        return cls.of(payload["voters"], payload.get("learners", ()), payload["uids"], payload["epoch"],
                      float(payload.get("forced_at", 0.0)))

    def to_payload(self) -> dict[str, Any]:
        """The config_change payload, with sorted lists so every node writes identical bytes."""
        return {"voters": sorted(self.voters), "learners": sorted(self.learners), "uids": dict(self.uids),
                "epoch": self.epoch, "forced_at": self.forced_at}

    def uid_of(self, node: str) -> str | None:
        """The store uid the configuration names for node, None for a non-member."""
        return dict(self.uids).get(node)

    def is_member(self, node: str, uid: str) -> bool:
        """node with this store uid is a voter or learner of this configuration."""
        return self.uid_of(node) == uid

    def is_voter(self, node: str, uid: str) -> bool:
        """node with this store uid is a voter of this configuration."""
        return node in self.voters and self.uid_of(node) == uid

    def forced(self, voters: Iterable[str], forced_at: float) -> VotingConfig:
        """The configuration a forced reconfiguration makes: `voters` (members of this one) become
        the only voters, in the next epoch; learners stay learners."""
        v = frozenset(voters)
        if not v or not v <= self.members:
            raise ConfigChangeError(f"forced voters {sorted(v)} must be members of {self.to_payload()}")
        uids = dict(self.uids)
        learners = self.learners - v
        return VotingConfig.of(v, learners, {n: uids[n] for n in v | learners}, self.epoch + 1, forced_at)

    @property
    def quorum(self) -> int:
        """Votes (or acknowledgements) needed from voters: a strict majority."""
        return len(self.voters) // 2 + 1

    @property
    def members(self) -> frozenset[str]:
        """Every node that replicates the log."""
        return self.voters | self.learners

    def changed(self, op: ChangeOp, node: str, max_voters: int, uid: str = "") -> VotingConfig:
        """The configuration after one single-server change; raises ConfigChangeError if invalid.
        Adding a node needs its store uid; promote and remove keep the uid the configuration has."""
        v, l, uids = set(self.voters), set(self.learners), dict(self.uids)
        adding = op in (ChangeOp.ADD_LEARNER, ChangeOp.ADD_VOTER)
        if adding and not valid_uid(uid):
            raise ConfigChangeError(f"{op.value} {node!r} needs the node's store uid, got {uid!r}")
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
            raise ConfigChangeError(f"{op.value} {node!r} does not apply to {self.to_payload()}")
        if len(v) > max_voters and len(v) > len(self.voters):
            raise ConfigChangeError(f"voter cap {max_voters} reached; add {node!r} as a learner")
        if not v:
            raise ConfigChangeError("a configuration needs at least one voter")
        if adding:
            uids[node] = uid
        elif op is ChangeOp.REMOVE:
            uids.pop(node)
        return VotingConfig.of(v, l, uids, self.epoch, self.forced_at)


History = list[tuple[int, VotingConfig]]


def load_history(storage: Any) -> History:
    """The snapshot's configuration followed by every config_change in the stored log, as
    (index, configuration) pairs: the last one is the configuration in force."""
    snap = storage.snapshot()
    history = [(snap.index, snap.membership)]
    lo = max(storage.first_index, snap.index + 1)
    for e in storage.entries(lo, storage.last_index + 1) if lo <= storage.last_index else []:
        if e.kind == RaftKind.CONFIG_CHANGE:
            history.append((e.index, VotingConfig.from_payload(e.payload)))
    return history


def history_after_append(history: History, entries: Iterable[Entry]) -> History:
    """The history once `entries` (contiguous) were appended: configurations they truncated
    away dropped (the first one always kept), theirs added."""
    entries = list(entries)
    start = entries[0].index
    out = [c for c in history if c[0] < start] or history[:1]
    out += [(e.index, VotingConfig.from_payload(e.payload)) for e in entries if e.kind == RaftKind.CONFIG_CHANGE]
    return out


def pruned_history(history: History, committed: int) -> History:
    """Keep the last configuration at or below the commit index and every later one."""
    keep = [c for c in history if c[0] <= committed][-1:]
    later = [c for c in history if c[0] > committed]
    return (keep or history[:1]) + later


class ConfigHistory:
    """The configurations in the log from the last committed one on, as (index, configuration)
    pairs; the last one is in force (a configuration takes effect once appended)."""

    def __init__(self, storage: Any) -> None:
        self.history: History = load_history(storage)

    @property
    def current(self) -> VotingConfig:
        """The configuration in force: the last one in the log, committed or not."""
        return self.history[-1][1]

    @property
    def last_index(self) -> int:
        """The log index of the configuration in force."""
        return self.history[-1][0]

    def appended(self, entries: Iterable[Entry]) -> None:
        """Follow entries appended to the log (contiguous): what they truncate away, what they add."""
        self.history = history_after_append(self.history, entries)

    def committed(self, index: int) -> None:
        """Forget configurations superseded by one committed at or below index."""
        self.history = pruned_history(self.history, index)

    def restored(self, index: int, conf: VotingConfig) -> None:
        """The log was replaced by a snapshot at index holding conf."""
        self.history = [(index, conf)]
