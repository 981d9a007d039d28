"""One typed payload per entry kind: what each kind of log entry records, checked when it is built.

The log, the wire and the Raft core carry a payload as a plain dict (msgpack's form, see entry.py);
the state machine owns what the dict means. Proposers build a payload here and hand the core its
``to_payload()``; ``decode`` turns a dict read from the log back into its type, or raises
BadPayload, so a malformed entry from an older build or a stranger never reaches a rule half-read.
Unknown extra keys are ignored, so a newer build's fields do not make an older one diverge.

Pure: no lmdb, asyncio, grpc, torch or clock.
"""

from __future__ import annotations

import enum
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Mapping, Union

from dpeer.statemachine.entry import EntryKind
from dpeer.statemachine.meta import valid_uid
from dpeer.view import MAX_SHARE, valid_shares, valid_site

# The speed classes a member record may carry (daemon/decide/speeds.py): quarter octaves of a
# box's micro-batches a second, so 2**-20 to 2**20 of them.
MIN_SPEED_CLASS, MAX_SPEED_CLASS = -80, 80


def valid_speed_class(value: object) -> bool:
    """Whether `value` may stand as a member's speed class: None (unknown) or an int in range."""
    return value is None or (type(value) is int and MIN_SPEED_CLASS <= value <= MAX_SPEED_CLASS)


class JobState(enum.StrEnum):
    """The committed state of the cluster's job: training goes on, halted as broken, or done."""

    RUNNING = "running"
    FAILED = "failed"
    FINISHED = "finished"


_SETTABLE = (JobState.RUNNING, JobState.FAILED)  # "finished" follows from the final checkpoint instead


class ControlMode(enum.StrEnum):
    """An operator's committed say on training: running, or paused (no group trains until resumed)."""

    RUNNING = "running"
    PAUSED = "paused"


class BadPayload(ValueError):
    """A payload lacks a field its kind needs or holds one of the wrong type; the text says which."""


def _need(ok: bool, kind: EntryKind, what: str) -> None:
    if not ok:
        raise BadPayload(f"{kind.value}: {what}")


def _is_int(v: Any, lo: int = 0) -> bool:
    return type(v) is int and v >= lo


def _is_str(v: Any, *, nonempty: bool = False) -> bool:
    return type(v) is str and (bool(v) or not nonempty)


def _is_ids(v: Any, *, nonempty: bool = False) -> bool:
    return (type(v) is tuple and all(type(x) is str and x for x in v) and len(set(v)) == len(v)
            and (bool(v) or not nonempty))


def _ids(v: Any) -> Any:
    """A list of ids as the tuple the payload holds (anything else is left for the check to refuse)."""
    return tuple(v) if type(v) in (list, tuple) else v


class _Record:
    """Shared by every payload: the dict form for the log, and the read back from it."""

    __slots__ = ()
    KIND: ClassVar[EntryKind]

    def to_payload(self) -> dict[str, Any]:
        """The dict the log stores: every field, tuples as lists, so every node writes equal bytes."""
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            out[f.name] = (list(v) if type(v) is tuple else dict(v) if isinstance(v, Mapping)
                           else v.value if isinstance(v, enum.Enum) else v)
        return out

    @classmethod
    def from_payload(cls, p: Mapping[str, Any]) -> Any:
        """Build from a log dict; absent optional fields take their defaults, extra keys are ignored."""
        known = fields(cls)  # type: ignore[arg-type]
        missing = [f.name for f in known if f.name not in p and f.default is MISSING]
        _need(not missing, cls.KIND, f"{', '.join(missing)} missing")
        return cls(**{f.name: (_ids(p[f.name]) if f.type.startswith("tuple") else p[f.name])
                      for f in known if f.name in p})


@dataclass(frozen=True, slots=True)
class MemberJoined(_Record):
    """A node is (again) an active member: where its daemon listens, its worker's store port (0: not
    announced), whether its worker has built the job, the store identity it joined with, its
    configured site ("" when none), the peers it measured near (daemon/decide/sites.py) and its
    speed class (None until its worker reported a speed; daemon/decide/speeds.py)."""

    KIND: ClassVar[EntryKind] = EntryKind.MEMBER_JOINED
    node_id: str
    addr: str
    store_port: int = 0
    ready: bool = True
    uid: str = ""
    site: str = ""
    near: tuple[str, ...] = ()
    speed_class: int | None = None

    def __post_init__(self) -> None:
        k = self.KIND
        _need(_is_str(self.node_id, nonempty=True), k, "node_id must be a non-empty string")
        _need(_is_str(self.addr), k, "addr must be a string")
        _need(type(self.store_port) is int and 0 <= self.store_port < 65536, k, "store_port must be 0..65535")
        _need(type(self.ready) is bool, k, "ready must be a bool")
        _need(self.uid == "" or valid_uid(self.uid), k, "uid must be empty or 32 lowercase hex digits")
        _need(self.site == "" or valid_site(self.site), k, "site must be empty or a site name")
        _need(_is_ids(self.near) and self.node_id not in self.near, k, "near must be distinct other node ids")
        _need(valid_speed_class(self.speed_class), k,
              f"speed_class must be None (unknown) or an int from {MIN_SPEED_CLASS} to {MAX_SPEED_CLASS}")


@dataclass(frozen=True, slots=True)
class _MemberEnded(_Record):
    """A member's membership ended: which node."""

    node_id: str

    def __post_init__(self) -> None:
        _need(_is_str(self.node_id, nonempty=True), self.KIND, "node_id must be a non-empty string")


@dataclass(frozen=True, slots=True)
class MemberLeft(_MemberEnded):
    """A member left on purpose."""

    KIND: ClassVar[EntryKind] = EntryKind.MEMBER_LEFT


@dataclass(frozen=True, slots=True)
class MemberDead(_MemberEnded):
    """A member was declared dead by gossip."""

    KIND: ClassVar[EntryKind] = EntryKind.MEMBER_DEAD


@dataclass(frozen=True, slots=True)
class ViewChange(_Record):
    """The next training view: its generation, members in rank order, the rank-0 store's host:port
    text, the secret the group derives its rendezvous and heal keys from, each member's site in rank
    order (empty: none named) and each member's share of a step in rank order (empty: even shares).
    A view with no members (only while training is paused) ends the current group at its next step
    boundary."""

    KIND: ClassVar[EntryKind] = EntryKind.VIEW
    generation: int
    members: tuple[str, ...]
    store_host: str
    secret: str = ""
    sites: tuple[str, ...] = ()
    shares: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        k = self.KIND
        _need(_is_int(self.generation, 1), k, "generation must be an int >= 1")
        _need(_is_ids(self.members), k, "members must be distinct non-empty ids")
        _need(_is_str(self.store_host), k, "store_host must be a string")
        _need(_is_str(self.secret), k, "secret must be a string")
        _need(type(self.sites) is tuple and len(self.sites) in (0, len(self.members))
              and all(valid_site(x) for x in self.sites), k, "sites must name a site for every member, or none")
        _need(type(self.shares) is tuple and valid_shares(self.shares, len(self.members)), k,
              f"shares must give every member a weight from 1 to {MAX_SHARE}, or none")


@dataclass(frozen=True, slots=True)
class CheckpointTaken(_Record):
    """A checkpoint the members agree on: its step, content digest, the nodes holding it, and
    whether it holds the job's last step."""

    KIND: ClassVar[EntryKind] = EntryKind.CHECKPOINT
    step: int
    digest: str
    holders: tuple[str, ...]
    final: bool = False

    def __post_init__(self) -> None:
        k = self.KIND
        _need(_is_int(self.step), k, "step must be an int >= 0")
        _need(_is_str(self.digest, nonempty=True), k, "digest must be a non-empty string")
        _need(_is_ids(self.holders), k, "holders must be distinct non-empty ids")
        _need(type(self.final) is bool, k, "final must be a bool")


@dataclass(frozen=True, slots=True)
class KvPut(_Record):
    """An operator's setting: key to value."""

    KIND: ClassVar[EntryKind] = EntryKind.KV_PUT
    key: str
    value: str

    def __post_init__(self) -> None:
        _need(_is_str(self.key, nonempty=True), self.KIND, "key must be a non-empty string")
        _need(_is_str(self.value), self.KIND, "value must be a string")


@dataclass(frozen=True, slots=True)
class KvDelete(_Record):
    """An operator's setting removed."""

    KIND: ClassVar[EntryKind] = EntryKind.KV_DELETE
    key: str

    def __post_init__(self) -> None:
        _need(_is_str(self.key, nonempty=True), self.KIND, "key must be a non-empty string")


@dataclass(frozen=True, slots=True)
class JobChange(_Record):
    """The job halted as broken (failed: why, on which box, at which step) or retried (running)."""

    KIND: ClassVar[EntryKind] = EntryKind.JOB
    state: JobState
    error: str = ""
    node: str = ""
    step: int = 0
    digest: str = ""

    def __post_init__(self) -> None:
        k = self.KIND
        _need(self.state in _SETTABLE, k, f"state must be one of {', '.join(_SETTABLE)}")
        object.__setattr__(self, "state", JobState(self.state))  # the log's string read back as the enum
        _need(_is_str(self.error) and _is_str(self.node) and _is_str(self.digest), k,
              "error, node and digest must be strings")
        _need(_is_int(self.step), k, "step must be an int >= 0")


@dataclass(frozen=True, slots=True)
class ControlChange(_Record):
    """An operator paused training (the leader then ends the group with an empty view) or resumed it."""

    KIND: ClassVar[EntryKind] = EntryKind.CONTROL
    mode: ControlMode

    def __post_init__(self) -> None:
        _need(self.mode in tuple(ControlMode), self.KIND, f"mode must be one of {', '.join(ControlMode)}")
        object.__setattr__(self, "mode", ControlMode(self.mode))


@dataclass(frozen=True, slots=True)
class Noop(_Record):
    """A new leader's first entry: it commits the leader's term; it records nothing."""

    KIND: ClassVar[EntryKind] = EntryKind.NOOP


@dataclass(frozen=True, slots=True)
class ConfigChange(_Record):
    """The voting configuration as the Raft core committed it: voters and learners (disjoint), the
    store identity of each, the cluster epoch (>= 1) and when a forced reconfiguration began it
    (unix seconds, 0.0 for a founded cluster). The core writes it; the state machine mirrors it."""

    KIND: ClassVar[EntryKind] = EntryKind.CONFIG_CHANGE
    voters: tuple[str, ...]
    learners: tuple[str, ...]
    uids: Mapping[str, str]
    epoch: int
    forced_at: float = 0.0

    def __post_init__(self) -> None:
        k = self.KIND
        _need(_is_ids(self.voters, nonempty=True), k, "voters must be distinct non-empty ids, at least one")
        _need(_is_ids(self.learners), k, "learners must be distinct non-empty ids")
        _need(not set(self.voters) & set(self.learners), k, "a node cannot be both voter and learner")
        _need(isinstance(self.uids, Mapping) and set(self.uids) == set(self.voters) | set(self.learners)
              and all(valid_uid(u) for u in self.uids.values()), k, "uids must name every voter and learner")
        _need(_is_int(self.epoch, 1), k, "epoch must be an int >= 1")
        _need(type(self.forced_at) is float and self.forced_at >= 0.0, k, "forced_at must be a float >= 0")


Payload = Union[MemberJoined, MemberLeft, MemberDead, ViewChange, CheckpointTaken, KvPut, KvDelete, JobChange,
                ControlChange, Noop, ConfigChange]

_TYPES: dict[EntryKind, type[_Record]] = {
    t.KIND: t for t in (MemberJoined, MemberLeft, MemberDead, ViewChange, CheckpointTaken, KvPut, KvDelete,
                        JobChange, ControlChange, Noop, ConfigChange)
}


def decode(kind: EntryKind, payload: Mapping[str, Any]) -> Payload:
    """The typed payload of a log entry's kind and dict; raises BadPayload when it is malformed."""
    return _TYPES[kind].from_payload(payload)  # type: ignore[return-value]
