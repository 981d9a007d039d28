from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemberState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALIVE: _ClassVar[MemberState]
    SUSPECT: _ClassVar[MemberState]
    DEAD: _ClassVar[MemberState]
    LEFT: _ClassVar[MemberState]
ALIVE: MemberState
SUSPECT: MemberState
DEAD: MemberState
LEFT: MemberState

class Heartbeat(_message.Message):
    __slots__ = ("node_id", "addr", "incarnation", "term", "last_applied", "commit_index", "sent_at")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    addr: str
    incarnation: int
    term: int
    last_applied: int
    commit_index: int
    sent_at: float
    def __init__(self, node_id: _Optional[str] = ..., addr: _Optional[str] = ..., incarnation: _Optional[int] = ..., term: _Optional[int] = ..., last_applied: _Optional[int] = ..., commit_index: _Optional[int] = ..., sent_at: _Optional[float] = ...) -> None: ...

class MemberUpdate(_message.Message):
    __slots__ = ("state", "node_id", "addr", "incarnation", "origin", "refused")
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    state: MemberState
    node_id: str
    addr: str
    incarnation: int
    origin: str
    refused: bool
    def __init__(self, state: _Optional[_Union[MemberState, str]] = ..., node_id: _Optional[str] = ..., addr: _Optional[str] = ..., incarnation: _Optional[int] = ..., origin: _Optional[str] = ..., refused: _Optional[bool] = ...) -> None: ...

class MemberRecord(_message.Message):
    __slots__ = ("node_id", "addr", "state", "incarnation", "term", "last_applied", "commit_index")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    addr: str
    state: MemberState
    incarnation: int
    term: int
    last_applied: int
    commit_index: int
    def __init__(self, node_id: _Optional[str] = ..., addr: _Optional[str] = ..., state: _Optional[_Union[MemberState, str]] = ..., incarnation: _Optional[int] = ..., term: _Optional[int] = ..., last_applied: _Optional[int] = ..., commit_index: _Optional[int] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("seq", "target", "hb", "updates")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    HB_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    target: str
    hb: Heartbeat
    updates: _containers.RepeatedCompositeFieldContainer[MemberUpdate]
    def __init__(self, seq: _Optional[int] = ..., target: _Optional[str] = ..., hb: _Optional[_Union[Heartbeat, _Mapping]] = ..., updates: _Optional[_Iterable[_Union[MemberUpdate, _Mapping]]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq", "hb", "updates")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HB_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    hb: Heartbeat
    updates: _containers.RepeatedCompositeFieldContainer[MemberUpdate]
    def __init__(self, seq: _Optional[int] = ..., hb: _Optional[_Union[Heartbeat, _Mapping]] = ..., updates: _Optional[_Iterable[_Union[MemberUpdate, _Mapping]]] = ...) -> None: ...

class PingReq(_message.Message):
    __slots__ = ("seq", "target", "target_addr", "hb", "updates")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    TARGET_ADDR_FIELD_NUMBER: _ClassVar[int]
    HB_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    target: str
    target_addr: str
    hb: Heartbeat
    updates: _containers.RepeatedCompositeFieldContainer[MemberUpdate]
    def __init__(self, seq: _Optional[int] = ..., target: _Optional[str] = ..., target_addr: _Optional[str] = ..., hb: _Optional[_Union[Heartbeat, _Mapping]] = ..., updates: _Optional[_Iterable[_Union[MemberUpdate, _Mapping]]] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("seq", "hb")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HB_FIELD_NUMBER: _ClassVar[int]
    seq: int
    hb: Heartbeat
    def __init__(self, seq: _Optional[int] = ..., hb: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class Gossip(_message.Message):
    __slots__ = ("hb", "updates")
    HB_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    hb: Heartbeat
    updates: _containers.RepeatedCompositeFieldContainer[MemberUpdate]
    def __init__(self, hb: _Optional[_Union[Heartbeat, _Mapping]] = ..., updates: _Optional[_Iterable[_Union[MemberUpdate, _Mapping]]] = ...) -> None: ...

class PushPull(_message.Message):
    __slots__ = ("hb", "members", "join", "reply")
    HB_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    hb: Heartbeat
    members: _containers.RepeatedCompositeFieldContainer[MemberRecord]
    join: bool
    reply: bool
    def __init__(self, hb: _Optional[_Union[Heartbeat, _Mapping]] = ..., members: _Optional[_Iterable[_Union[MemberRecord, _Mapping]]] = ..., join: _Optional[bool] = ..., reply: _Optional[bool] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("index", "term", "kind", "payload")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    kind: str
    payload: bytes
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., kind: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class VoteRequest(_message.Message):
    __slots__ = ("term", "candidate", "last_index", "last_term", "pre_vote")
    TERM_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_TERM_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    term: int
    candidate: str
    last_index: int
    last_term: int
    pre_vote: bool
    def __init__(self, term: _Optional[int] = ..., candidate: _Optional[str] = ..., last_index: _Optional[int] = ..., last_term: _Optional[int] = ..., pre_vote: _Optional[bool] = ...) -> None: ...

class VoteResponse(_message.Message):
    __slots__ = ("term", "granted", "pre_vote", "reason")
    TERM_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    term: int
    granted: bool
    pre_vote: bool
    reason: str
    def __init__(self, term: _Optional[int] = ..., granted: _Optional[bool] = ..., pre_vote: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("term", "leader", "prev_index", "prev_term", "entries", "commit")
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    PREV_INDEX_FIELD_NUMBER: _ClassVar[int]
    PREV_TERM_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    term: int
    leader: str
    prev_index: int
    prev_term: int
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    commit: int
    def __init__(self, term: _Optional[int] = ..., leader: _Optional[str] = ..., prev_index: _Optional[int] = ..., prev_term: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., commit: _Optional[int] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("term", "success", "match_index", "reject_hint", "reject_term")
    TERM_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    REJECT_HINT_FIELD_NUMBER: _ClassVar[int]
    REJECT_TERM_FIELD_NUMBER: _ClassVar[int]
    term: int
    success: bool
    match_index: int
    reject_hint: int
    reject_term: int
    def __init__(self, term: _Optional[int] = ..., success: _Optional[bool] = ..., match_index: _Optional[int] = ..., reject_hint: _Optional[int] = ..., reject_term: _Optional[int] = ...) -> None: ...

class RaftHeartbeat(_message.Message):
    __slots__ = ("term", "leader", "commit", "read_seq", "idle")
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    READ_SEQ_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    term: int
    leader: str
    commit: int
    read_seq: int
    idle: bool
    def __init__(self, term: _Optional[int] = ..., leader: _Optional[str] = ..., commit: _Optional[int] = ..., read_seq: _Optional[int] = ..., idle: _Optional[bool] = ...) -> None: ...

class RaftHeartbeatResponse(_message.Message):
    __slots__ = ("term", "read_seq")
    TERM_FIELD_NUMBER: _ClassVar[int]
    READ_SEQ_FIELD_NUMBER: _ClassVar[int]
    term: int
    read_seq: int
    def __init__(self, term: _Optional[int] = ..., read_seq: _Optional[int] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("term", "leader", "index", "term_of_index", "data", "voters", "learners", "uids", "epoch", "forced_at")
    class UidsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_OF_INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    UIDS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FORCED_AT_FIELD_NUMBER: _ClassVar[int]
    term: int
    leader: str
    index: int
    term_of_index: int
    data: bytes
    voters: _containers.RepeatedScalarFieldContainer[str]
    learners: _containers.RepeatedScalarFieldContainer[str]
    uids: _containers.ScalarMap[str, str]
    epoch: int
    forced_at: float
    def __init__(self, term: _Optional[int] = ..., leader: _Optional[str] = ..., index: _Optional[int] = ..., term_of_index: _Optional[int] = ..., data: _Optional[bytes] = ..., voters: _Optional[_Iterable[str]] = ..., learners: _Optional[_Iterable[str]] = ..., uids: _Optional[_Mapping[str, str]] = ..., epoch: _Optional[int] = ..., forced_at: _Optional[float] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("from_id", "from_addr", "from_uid", "from_epoch", "to_uid", "from_boot", "from_up", "ping", "ack", "ping_req", "nack", "gossip", "push_pull", "vote_request", "vote_response", "append_request", "append_response", "raft_heartbeat", "raft_heartbeat_response", "snapshot_request")
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ADDR_FIELD_NUMBER: _ClassVar[int]
    FROM_UID_FIELD_NUMBER: _ClassVar[int]
    FROM_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TO_UID_FIELD_NUMBER: _ClassVar[int]
    FROM_BOOT_FIELD_NUMBER: _ClassVar[int]
    FROM_UP_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PING_REQ_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_FIELD_NUMBER: _ClassVar[int]
    PUSH_PULL_FIELD_NUMBER: _ClassVar[int]
    VOTE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    VOTE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    APPEND_REQUEST_FIELD_NUMBER: _ClassVar[int]
    APPEND_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    RAFT_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    RAFT_HEARTBEAT_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_REQUEST_FIELD_NUMBER: _ClassVar[int]
    from_id: str
    from_addr: str
    from_uid: str
    from_epoch: int
    to_uid: str
    from_boot: str
    from_up: float
    ping: Ping
    ack: Ack
    ping_req: PingReq
    nack: Nack
    gossip: Gossip
    push_pull: PushPull
    vote_request: VoteRequest
    vote_response: VoteResponse
    append_request: AppendRequest
    append_response: AppendResponse
    raft_heartbeat: RaftHeartbeat
    raft_heartbeat_response: RaftHeartbeatResponse
    snapshot_request: SnapshotRequest
    def __init__(self, from_id: _Optional[str] = ..., from_addr: _Optional[str] = ..., from_uid: _Optional[str] = ..., from_epoch: _Optional[int] = ..., to_uid: _Optional[str] = ..., from_boot: _Optional[str] = ..., from_up: _Optional[float] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., ping_req: _Optional[_Union[PingReq, _Mapping]] = ..., nack: _Optional[_Union[Nack, _Mapping]] = ..., gossip: _Optional[_Union[Gossip, _Mapping]] = ..., push_pull: _Optional[_Union[PushPull, _Mapping]] = ..., vote_request: _Optional[_Union[VoteRequest, _Mapping]] = ..., vote_response: _Optional[_Union[VoteResponse, _Mapping]] = ..., append_request: _Optional[_Union[AppendRequest, _Mapping]] = ..., append_response: _Optional[_Union[AppendResponse, _Mapping]] = ..., raft_heartbeat: _Optional[_Union[RaftHeartbeat, _Mapping]] = ..., raft_heartbeat_response: _Optional[_Union[RaftHeartbeatResponse, _Mapping]] = ..., snapshot_request: _Optional[_Union[SnapshotRequest, _Mapping]] = ...) -> None: ...

class Delivered(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnvelopeBatch(_message.Message):
    __slots__ = ("envelopes",)
    ENVELOPES_FIELD_NUMBER: _ClassVar[int]
    envelopes: _containers.RepeatedCompositeFieldContainer[Envelope]
    def __init__(self, envelopes: _Optional[_Iterable[_Union[Envelope, _Mapping]]] = ...) -> None: ...

class FetchEntriesRequest(_message.Message):
    __slots__ = ("node_id", "from_index", "to_index", "max_chunk_bytes")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_INDEX_FIELD_NUMBER: _ClassVar[int]
    TO_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    from_index: int
    to_index: int
    max_chunk_bytes: int
    def __init__(self, node_id: _Optional[str] = ..., from_index: _Optional[int] = ..., to_index: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ...) -> None: ...

class EntryChunk(_message.Message):
    __slots__ = ("entries", "commit_index", "term", "uid", "epoch")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    commit_index: int
    term: int
    uid: str
    epoch: int
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., commit_index: _Optional[int] = ..., term: _Optional[int] = ..., uid: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("node_id", "addr", "store_port", "ready", "uid", "boot", "up", "site", "near", "speed_class")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    BOOT_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    NEAR_FIELD_NUMBER: _ClassVar[int]
    SPEED_CLASS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    addr: str
    store_port: int
    ready: bool
    uid: str
    boot: str
    up: float
    site: str
    near: _containers.RepeatedScalarFieldContainer[str]
    speed_class: int
    def __init__(self, node_id: _Optional[str] = ..., addr: _Optional[str] = ..., store_port: _Optional[int] = ..., ready: _Optional[bool] = ..., uid: _Optional[str] = ..., boot: _Optional[str] = ..., up: _Optional[float] = ..., site: _Optional[str] = ..., near: _Optional[_Iterable[str]] = ..., speed_class: _Optional[int] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("accepted", "leader_id", "leader_addr", "members", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    leader_id: str
    leader_addr: str
    members: _containers.RepeatedCompositeFieldContainer[MemberRecord]
    reason: str
    def __init__(self, accepted: _Optional[bool] = ..., leader_id: _Optional[str] = ..., leader_addr: _Optional[str] = ..., members: _Optional[_Iterable[_Union[MemberRecord, _Mapping]]] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("node_id", "forwarded")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    forwarded: bool
    def __init__(self, node_id: _Optional[str] = ..., forwarded: _Optional[bool] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ("accepted", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class GroupFailedRequest(_message.Message):
    __slots__ = ("node_id", "generation", "reason", "phase", "step", "error", "attempt")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    generation: int
    reason: str
    phase: str
    step: int
    error: str
    attempt: int
    def __init__(self, node_id: _Optional[str] = ..., generation: _Optional[int] = ..., reason: _Optional[str] = ..., phase: _Optional[str] = ..., step: _Optional[int] = ..., error: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class GroupFailedReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ForceRequest(_message.Message):
    __slots__ = ("voters", "confirm")
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    voters: _containers.RepeatedScalarFieldContainer[str]
    confirm: bool
    def __init__(self, voters: _Optional[_Iterable[str]] = ..., confirm: _Optional[bool] = ...) -> None: ...

class ForceReply(_message.Message):
    __slots__ = ("term", "reason", "epoch")
    TERM_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    term: int
    reason: str
    epoch: int
    def __init__(self, term: _Optional[int] = ..., reason: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class CheckpointReport(_message.Message):
    __slots__ = ("node_id", "step", "digest", "final")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    step: int
    digest: str
    final: bool
    def __init__(self, node_id: _Optional[str] = ..., step: _Optional[int] = ..., digest: _Optional[str] = ..., final: _Optional[bool] = ...) -> None: ...

class JobControlRequest(_message.Message):
    __slots__ = ("action",)
    ACTION_FIELD_NUMBER: _ClassVar[int]
    action: str
    def __init__(self, action: _Optional[str] = ...) -> None: ...

class JobControlReply(_message.Message):
    __slots__ = ("accepted", "reason", "index")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    index: int
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class FetchCheckpointRequest(_message.Message):
    __slots__ = ("step", "offset")
    STEP_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    step: int
    offset: int
    def __init__(self, step: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class CheckpointChunk(_message.Message):
    __slots__ = ("step", "offset", "data", "total_size", "done")
    STEP_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    step: int
    offset: int
    data: bytes
    total_size: int
    done: bool
    def __init__(self, step: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total_size: _Optional[int] = ..., done: _Optional[bool] = ...) -> None: ...

class CheckpointReply(_message.Message):
    __slots__ = ("committed_step",)
    COMMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    committed_step: int
    def __init__(self, committed_step: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class KvPutRequest(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class KvPutReply(_message.Message):
    __slots__ = ("committed", "index", "leader_id", "reason")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    committed: bool
    index: int
    leader_id: str
    reason: str
    def __init__(self, committed: _Optional[bool] = ..., index: _Optional[int] = ..., leader_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class KvGetRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class KvGetReply(_message.Message):
    __slots__ = ("found", "value", "read_index", "reason")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    READ_INDEX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: str
    read_index: int
    reason: str
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[str] = ..., read_index: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class KvDeleteRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class KvDeleteReply(_message.Message):
    __slots__ = ("committed", "index", "leader_id", "reason", "found")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    committed: bool
    index: int
    leader_id: str
    reason: str
    found: bool
    def __init__(self, committed: _Optional[bool] = ..., index: _Optional[int] = ..., leader_id: _Optional[str] = ..., reason: _Optional[str] = ..., found: _Optional[bool] = ...) -> None: ...

class KvListRequest(_message.Message):
    __slots__ = ("prefix",)
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    def __init__(self, prefix: _Optional[str] = ...) -> None: ...

class KvPair(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class KvListReply(_message.Message):
    __slots__ = ("pairs", "read_index")
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    READ_INDEX_FIELD_NUMBER: _ClassVar[int]
    pairs: _containers.RepeatedCompositeFieldContainer[KvPair]
    read_index: int
    def __init__(self, pairs: _Optional[_Iterable[_Union[KvPair, _Mapping]]] = ..., read_index: _Optional[int] = ...) -> None: ...
