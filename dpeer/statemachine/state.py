"""The applied cluster state and the pure, deterministic function that applies entries to it.

Pure: no lmdb, asyncio, grpc, torch or clock. ``apply`` never mutates its input; a batch is
applied to one private working copy, so replay costs about a microsecond per entry.
"""

from __future__ import annotations

import zlib
import enum
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import msgpack

from dpeer.address import Address
from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.errors import CorruptState
from dpeer.statemachine.meta import valid_uid
from dpeer.statemachine.payloads import (
    BadPayload, CheckpointTaken, ConfigChange, ControlChange, ControlMode, JobChange, JobState, KvDelete, KvPut, MemberDead,
    MemberJoined, MemberLeft, ViewChange, decode, valid_speed_class,
)
from dpeer.view import View, valid_shares, valid_site

STATE_VERSION = 1
_EMPTY: Mapping[str, Any] = MappingProxyType({})


class MemberStatus(enum.StrEnum):
    """A member's committed status: active until a member_left or member_dead entry ends it."""

    ACTIVE = "active"
    LEFT = "left"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class Member:
    """A node known to the cluster: where to reach it, its status, the entry that admitted it,
    the port its worker's rendezvous store listens on when it is rank 0 (0: not announced),
    whether its worker has built the job and waits for a view (only ready members train), and
    the identity (store uid) it joined with: a new uid under a known node id is a lost disk; its
    configured site ("" when none), the peers it measured near (daemon/decide/sites.py) and its
    speed class (None: unknown; daemon/decide/speeds.py)."""

    addr: str
    status: MemberStatus
    joined_index: int
    store_port: int = 0
    ready: bool = True
    uid: str = ""
    site: str = ""
    near: tuple[str, ...] = ()
    speed_class: int | None = None

    def __post_init__(self) -> None:
        """Take a status by its value too ("active"); an unknown one raises ValueError."""
        object.__setattr__(self, "status", MemberStatus(self.status))


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The last committed checkpoint: training step, content digest and the nodes holding it;
    `final` when it holds the job's last step (the job is then finished)."""

    step: int
    digest: str
    holders: tuple[str, ...]
    final: bool = False


@dataclass(frozen=True, slots=True)
class Job:
    """The job's committed state. FAILED: `error` (one line), the box and step it came from;
    FINISHED: the final step and its parameter digest; RUNNING: after an operator's retry."""

    state: JobState
    error: str = ""
    node: str = ""
    step: int = 0
    digest: str = ""


RUNNING_JOB = Job(JobState.RUNNING)


@dataclass(frozen=True, slots=True)
class ClusterState:
    """Everything the committed log says about the cluster, as of ``applied_index``; voters,
    learners, their identities (uids), the cluster epoch and when it was forced come from the
    last config_change."""

    applied_index: int = 0
    applied_term: int = 0
    members: Mapping[str, Member] = field(default_factory=lambda: _EMPTY)
    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    view: View | None = None
    checkpoint: Checkpoint | None = None
    kv: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    control: ControlMode = ControlMode.RUNNING
    job: Job = RUNNING_JOB
    uids: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    epoch: int = 0
    forced_at: float = 0.0


class ApplyResult(NamedTuple):
    """The outcome of applying one entry; a rejected entry changes nothing but applied_index. An
    accepted view entry carries the View it committed (the one type that reaches the worker)."""

    index: int
    kind: EntryKind
    accepted: bool
    reason: str = ""
    view: View | None = None


class _Work:
    """A private mutable copy of a ClusterState, used while a batch is applied."""

    __slots__ = ("index", "term", "members", "voters", "learners", "view", "ckpt", "kv", "control", "job", "uids",
                 "epoch", "forced_at")

    def __init__(self, s: ClusterState) -> None:
        self.index, self.term = s.applied_index, s.applied_term
        self.members = dict(s.members)
        self.voters, self.learners = s.voters, s.learners
        self.view, self.ckpt = s.view, s.checkpoint
        self.kv = dict(s.kv)
        self.control = s.control
        self.job = s.job
        self.uids, self.epoch, self.forced_at = s.uids, s.epoch, s.forced_at

    def freeze(self) -> ClusterState:
        """Wrap the working copy as an immutable ClusterState (the dicts are not shared again)."""
        return ClusterState(
            self.index, self.term, MappingProxyType(self.members), self.voters, self.learners,
            self.view, self.ckpt, MappingProxyType(self.kv), self.control, self.job, self.uids, self.epoch,
            self.forced_at,
        )


def apply(state: ClusterState, entry: Entry) -> tuple[ClusterState, ApplyResult]:
    """Apply one committed entry (index must be applied_index + 1); returns the new state."""
    new, results = apply_many(state, (entry,))
    return new, results[0]


def apply_many(
    state: ClusterState, entries: Iterable[Entry]
) -> tuple[ClusterState, list[ApplyResult]]:
    """Apply consecutive committed entries in order; the input state is left unchanged."""
    w = _Work(state)
    results = []
    for e in entries:
        if e.index != w.index + 1:
            raise ValueError(f"entry {e.index} applied out of order (applied_index {w.index})")
        if e.term < w.term:
            raise ValueError(f"entry {e.index} has term {e.term} below applied term {w.term}")
        try:
            payload = decode(e.kind, e.payload)
        except BadPayload as exc:
            reason = f"malformed payload ({exc})"
        else:
            reason = _RULES[e.kind](w, payload, e.index)  # type: ignore[operator]
        w.index, w.term = e.index, e.term
        view = w.view if e.kind is EntryKind.VIEW and not reason else None
        results.append(ApplyResult(e.index, e.kind, not reason, reason, view))
    return w.freeze(), results


def _joined(w: _Work, p: MemberJoined, index: int) -> str:
    old = w.members.get(p.node_id)
    joined = old.joined_index if old is not None and old.status is MemberStatus.ACTIVE else index
    w.members[p.node_id] = Member(p.addr, MemberStatus.ACTIVE, joined, p.store_port, p.ready, p.uid, p.site, p.near,
                                  p.speed_class)
    return ""


def _status(status: MemberStatus) -> Callable[[_Work, MemberLeft | MemberDead, int], str]:
    def rule(w: _Work, p: MemberLeft | MemberDead, index: int) -> str:
        old = w.members.get(p.node_id)
        if old is None:
            return f"unknown member {p.node_id}"
        if old.status is not MemberStatus.ACTIVE:
            return f"member {p.node_id} is already {old.status}"
        w.members[p.node_id] = replace(old, status=status)
        return ""

    return rule


def _view(w: _Work, p: ViewChange, index: int) -> str:
    current = w.view.generation if w.view is not None else 0
    if p.generation != current + 1:
        return f"view generation {p.generation} is not current generation {current} + 1"
    absent = [m for m in p.members if getattr(w.members.get(m), "status", None) is not MemberStatus.ACTIVE]
    if absent:
        return f"view names members that are not active: {absent}"
    paused = w.control is ControlMode.PAUSED
    if paused and p.members:
        return "training is paused: a view may only end the group (name no members)"
    if not paused and not p.members:
        return "a view without members only ends a group while training is paused"
    w.view = View(p.generation, p.members, Address.read(p.store_host), p.secret, p.sites, p.shares)
    return ""


def _checkpoint(w: _Work, p: CheckpointTaken, index: int) -> str:
    if w.ckpt is not None and p.step <= w.ckpt.step:
        return f"checkpoint step {p.step} is not after step {w.ckpt.step}"
    w.ckpt = Checkpoint(p.step, p.digest, p.holders, p.final)
    if w.ckpt.final and w.job.state is JobState.RUNNING:
        w.job = Job(JobState.FINISHED, step=p.step, digest=p.digest)
        w.control = ControlMode.RUNNING  # a pause that raced the last step ends with the job
    return ""


def _kv_put(w: _Work, p: KvPut, index: int) -> str:
    w.kv[p.key] = p.value
    return ""


def _kv_delete(w: _Work, p: KvDelete, index: int) -> str:
    return "" if w.kv.pop(p.key, None) is not None else f"no key {p.key!r}"


def _job(w: _Work, p: JobChange, index: int) -> str:
    """failed ends a running job; running (an operator's retry) restarts a failed one. A job
    finishes with its final checkpoint (see _checkpoint), not through this entry."""
    new, old = p.state, w.job.state
    if old is JobState.FINISHED:
        return "the job has already finished"
    if new is JobState.RUNNING and old is not JobState.FAILED:
        return "only a failed job can be retried"
    if new is JobState.FAILED and old is JobState.FAILED:
        return "the job has already failed"
    w.job = Job(new, p.error, p.node, p.step, p.digest)
    return ""


def _control(w: _Work, p: ControlChange, index: int) -> str:
    """An operator's pause or resume; the leader follows a pause with an empty view (see _view)."""
    if w.job.state is JobState.FINISHED:
        return "the job has already finished"
    if p.mode is w.control:
        return f"training is already {p.mode}"
    w.control = p.mode
    return ""


def _config(w: _Work, p: ConfigChange, index: int) -> str:
    w.voters, w.learners = p.voters, p.learners
    w.uids = MappingProxyType(dict(p.uids))
    w.epoch, w.forced_at = p.epoch, p.forced_at
    return ""


_RULES: dict[EntryKind, Callable[[_Work, Any, int], str]] = {
    EntryKind.MEMBER_JOINED: _joined,
    EntryKind.MEMBER_LEFT: _status(MemberStatus.LEFT),
    EntryKind.MEMBER_DEAD: _status(MemberStatus.DEAD),
    EntryKind.VIEW: _view,
    EntryKind.CHECKPOINT: _checkpoint,
    EntryKind.KV_PUT: _kv_put,
    EntryKind.KV_DELETE: _kv_delete,
    EntryKind.NOOP: lambda w, p, i: "",
    EntryKind.CONFIG_CHANGE: _config,
    EntryKind.JOB: _job,
    EntryKind.CONTROL: _control,
}
"""One rule per kind: it gets the decoded payload and returns "" when accepted, else why not."""


def state_to_dict(s: ClusterState) -> dict[str, Any]:
    """A msgpack-able dict of the state, for the `state` sub-db and snapshots."""
    return {
        "v": STATE_VERSION,
        "applied_index": s.applied_index,
        "applied_term": s.applied_term,
        "members": {k: [m.addr, m.status.value, m.joined_index, m.store_port, m.ready, m.uid]
                    for k, m in s.members.items()},
        # Apart from "members" and "view", whose lists an older build reads at a fixed length.
        "sites": {"members": {k: [m.site, list(m.near)] for k, m in s.members.items() if m.site or m.near},
                  "view": list(s.view.sites) if s.view is not None else []},
        "speeds": {"members": {k: m.speed_class for k, m in s.members.items() if m.speed_class is not None},
                   "view": list(s.view.shares) if s.view is not None else []},
        "voters": list(s.voters),
        "learners": list(s.learners),
        "view": None if s.view is None else [s.view.generation, list(s.view.members), str(s.view.store),
                                             s.view.secret],
        "checkpoint": None
        if s.checkpoint is None
        else [s.checkpoint.step, s.checkpoint.digest, list(s.checkpoint.holders), s.checkpoint.final],
        "kv": dict(s.kv),
        "control": s.control.value,
        "job": [s.job.state.value, s.job.error, s.job.node, s.job.step, s.job.digest],
        "uids": dict(s.uids),
        "epoch": s.epoch,
        "forced_at": s.forced_at,
    }


def state_from_dict(d: Any) -> ClusterState:
    """Validate and rebuild a state from state_to_dict's form; raises CorruptState on any defect."""
    try:
        return _from_dict(d)
    except CorruptState:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptState(f"cluster state is malformed: {exc!r}") from exc


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise CorruptState(f"cluster state is malformed: {what}")


def _ids(v: Any) -> tuple[str, ...]:
    _need(type(v) is list and all(type(x) is str for x in v) and len(set(v)) == len(v), "id list")
    return tuple(v)


def _from_dict(d: Any) -> ClusterState:
    _need(type(d) is dict and d.get("v") == STATE_VERSION, f"version {d.get('v') if type(d) is dict else d!r}")
    idx, term = d["applied_index"], d["applied_term"]
    _need(type(idx) is int and idx >= 0 and type(term) is int and term >= 0, "applied index/term")
    members = {}
    for nid, (addr, status, joined, store_port, ready, uid) in d["members"].items():
        _need(type(nid) is str and type(addr) is str and status in {s.value for s in MemberStatus}, "member")
        _need(type(joined) is int and 0 < joined <= idx, "member joined_index")
        _need(type(store_port) is int and 0 <= store_port < 65536 and type(ready) is bool, "member store_port/ready")
        _need(uid == "" or valid_uid(uid), "member uid")
        members[nid] = Member(addr, status, joined, store_port, ready, uid)
    sites = d.get("sites", {"members": {}, "view": []})  # absent: written before sites
    _need(type(sites) is dict and type(sites.get("members")) is dict and type(sites.get("view")) is list, "sites")
    for nid, (site, near) in sites["members"].items():
        _need(nid in members and (site == "" or valid_site(site)), "member site")
        members[nid] = replace(members[nid], site=site, near=_ids(near))
    speeds = d.get("speeds", {"members": {}, "view": []})  # absent: written before speeds
    _need(type(speeds) is dict and type(speeds.get("members")) is dict and type(speeds.get("view")) is list, "speeds")
    for nid, speed_class in speeds["members"].items():
        _need(nid in members and speed_class is not None and valid_speed_class(speed_class), "member speed class")
        members[nid] = replace(members[nid], speed_class=speed_class)
    view = None
    if d["view"] is not None:
        gen, vmembers, host, secret = d["view"]
        _need(type(gen) is int and gen >= 1 and type(host) is str and type(secret) is str, "view")
        vsites = tuple(sites["view"])
        _need(len(vsites) in (0, len(vmembers)) and all(valid_site(x) for x in vsites), "view sites")
        vshares = tuple(speeds["view"])
        _need(valid_shares(vshares, len(vmembers)), "view shares")
        view = View(gen, _ids(vmembers), Address.read(host), secret, vsites, vshares)
    ckpt = None
    if d["checkpoint"] is not None:
        step, digest, holders, final = d["checkpoint"]
        _need(type(step) is int and step >= 0 and type(digest) is str and type(final) is bool, "checkpoint")
        ckpt = Checkpoint(step, digest, _ids(holders), final)
    kv = d["kv"]
    _need(type(kv) is dict and all(type(k) is str and type(v) is str for k, v in kv.items()), "kv")
    _need(d["control"] in tuple(ControlMode), "control mode")
    voters, learners, uids = _ids(d["voters"]), _ids(d["learners"]), d["uids"]
    _need(type(uids) is dict and set(uids) == set(voters) | set(learners)
          and all(valid_uid(u) for u in uids.values()), "uids")
    epoch, forced_at = d["epoch"], d["forced_at"]
    _need(type(epoch) is int and epoch >= 0 and type(forced_at) is float and forced_at >= 0, "epoch/forced_at")
    return ClusterState(
        idx, term, MappingProxyType(members), voters, learners,
        view, ckpt, MappingProxyType(dict(kv)), ControlMode(d["control"]), _job_from(d["job"]), MappingProxyType(dict(uids)), epoch, forced_at,
    )


def _job_from(v: Any) -> Job:
    """The job record of state_to_dict's form."""
    state, error, node, step, digest = v
    _need(state in {s.value for s in JobState} and type(error) is str and type(node) is str
          and type(step) is int and step >= 0 and type(digest) is str, "job")
    return Job(JobState(state), error, node, step, digest)


def encode_state(s: ClusterState) -> bytes:
    """Serialize a state to bytes sealed with a CRC32 prefix (big-endian, 4 bytes)."""
    return seal(msgpack.packb(state_to_dict(s), use_bin_type=True))


def decode_state(data: bytes) -> ClusterState:
    """Inverse of encode_state; raises CorruptState on a CRC mismatch or malformed content."""
    try:
        d = msgpack.unpackb(unseal(data), raw=False, strict_map_key=True)
    except CorruptState:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise CorruptState(f"cluster state is not valid msgpack: {exc}") from exc
    return state_from_dict(d)


def seal(body: bytes) -> bytes:
    """Prefix bytes with their CRC32 so a reader can tell torn or flipped data from good data."""
    return zlib.crc32(body).to_bytes(4, "big") + body


def unseal(data: bytes) -> bytes:
    """Check and strip the CRC32 prefix written by seal; raises CorruptState on mismatch."""
    if len(data) < 4 or zlib.crc32(data[4:]) != int.from_bytes(data[:4], "big"):
        raise CorruptState("CRC mismatch in sealed record")
    return bytes(data[4:])
