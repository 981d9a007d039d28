"""The requests and replies of the Peer service's calls, as the daemon and its callers see them.

Plain dataclasses with the fields (names and defaults) of the wire's protobuf messages of the
same names; transport/wire.py converts them, so nothing outside dpeer/transport/ (and the CLI's
client) touches the generated code. Log entries and membership rows arrive as the cores' types.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpeer.membership.messages import MemberRecord
from dpeer.statemachine.entry import Entry


@dataclass(frozen=True)
class FetchEntriesRequest:
    """Committed entries [from_index, to_index] (to the commit index when 0) for node_id."""

    node_id: str = ""
    from_index: int = 0
    to_index: int = 0
    max_chunk_bytes: int = 0


@dataclass(frozen=True)
class EntryChunk:
    """A run of committed entries, with the sender's commit index, term, store uid and epoch."""

    entries: tuple[Entry, ...] = ()
    commit_index: int = 0
    term: int = 0
    uid: str = ""
    epoch: int = 0


@dataclass(frozen=True)
class JoinRequest:
    """A daemon asks to be admitted: its id, address, store, identity, age and place."""

    node_id: str = ""
    addr: str = ""
    store_port: int = 0
    ready: bool = False
    uid: str = ""
    boot: str = ""
    up: float = 0.0
    site: str = ""
    near: tuple[str, ...] = ()
    speed_class: int | None = None  # None: unknown (an optional field on the wire)


@dataclass(frozen=True)
class JoinReply:
    """The leader's answer to a join: the members to gossip with."""

    accepted: bool = False
    leader_id: str = ""
    leader_addr: str = ""
    members: tuple[MemberRecord, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class LeaveRequest:
    """Leave (this node when node_id is empty), or commit a forwarded leave on the leader."""

    node_id: str = ""
    forwarded: bool = False


@dataclass(frozen=True)
class LeaveReply:
    """Whether the leave was taken."""

    accepted: bool = False
    reason: str = ""


@dataclass(frozen=True)
class GroupFailedRequest:
    """A worker's group (or a job's build) failed."""

    node_id: str = ""
    generation: int = 0
    reason: str = ""
    phase: str = ""
    step: int = 0
    error: str = ""
    attempt: int = 0


@dataclass(frozen=True)
class GroupFailedReply:
    """The failure is recorded."""


@dataclass(frozen=True)
class ForceRequest:
    """The operator's unsafe recovery to these voters."""

    voters: tuple[str, ...] = ()
    confirm: bool = False


@dataclass(frozen=True)
class ForceReply:
    """The term and epoch the forced configuration was written under."""

    term: int = 0
    reason: str = ""
    epoch: int = 0


@dataclass(frozen=True)
class CheckpointReport:
    """A node holds the checkpoint of step (final: the job's last)."""

    node_id: str = ""
    step: int = 0
    digest: str = ""
    final: bool = False


@dataclass(frozen=True)
class CheckpointReply:
    """The newest checkpoint step a majority holds."""

    committed_step: int = 0


@dataclass(frozen=True)
class JobControlRequest:
    """An operator's job command (retry, pause, resume)."""

    action: str = ""


@dataclass(frozen=True)
class JobControlReply:
    """Whether the command was committed, why not, and its log index."""

    accepted: bool = False
    reason: str = ""
    index: int = 0


@dataclass(frozen=True)
class FetchCheckpointRequest:
    """A checkpoint file of step, from offset on."""

    step: int = 0
    offset: int = 0


@dataclass(frozen=True)
class CheckpointChunk:
    """A piece of a checkpoint file."""

    step: int = 0
    offset: int = 0
    data: bytes = b""
    total_size: int = 0
    done: bool = False


@dataclass(frozen=True)
class StatusReply:
    """The node's status document as JSON text."""

    json: str = ""


@dataclass(frozen=True)
class KvPutRequest:
    """Commit key=value."""

    key: str = ""
    value: str = ""


@dataclass(frozen=True)
class KvPutReply:
    """Whether and where the setting was committed."""

    committed: bool = False
    index: int = 0
    leader_id: str = ""
    reason: str = ""


@dataclass(frozen=True)
class KvGetRequest:
    """A linearizable read of key."""

    key: str = ""


@dataclass(frozen=True)
class KvGetReply:
    """The value of a key, if found, and the index it was read at."""

    found: bool = False
    value: str = ""
    read_index: int = 0
    reason: str = ""


@dataclass(frozen=True)
class KvDeleteRequest:
    """Commit key's removal."""

    key: str = ""


@dataclass(frozen=True)
class KvDeleteReply:
    """Whether and where the removal was committed, and whether the key was there."""

    committed: bool = False
    index: int = 0
    leader_id: str = ""
    reason: str = ""
    found: bool = False


@dataclass(frozen=True)
class KvListRequest:
    """A linearizable read of the settings under prefix."""

    prefix: str = ""


@dataclass(frozen=True)
class KvPair:
    """One setting."""

    key: str = ""
    value: str = ""


@dataclass(frozen=True)
class KvListReply:
    """The settings under a prefix, and the index they were read at."""

    pairs: tuple[KvPair, ...] = ()
    read_index: int = 0
