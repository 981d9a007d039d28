"""Maps the pure cores' messages (in an api.Envelope) to the wire's protobuf Envelope and back.

Decoding validates every field (the entry checks here, then checks.check: the cores' validate(),
the sender's identity and boot) and raises BadRequest, so a malformed or hostile message never
reaches a core.
"""

from __future__ import annotations

from typing import Any, Callable

from dpeer.consensus import messages as rm
from dpeer.errors import BadRequest
from dpeer.membership import messages as mm
from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.statemachine.entry import Entry, entry_from_wire, entry_to_wire
from dpeer.statemachine.errors import CorruptEntry
from dpeer.transport.api import Envelope
from dpeer.transport.checks import check, entry_count
_STATES = [mm.MemberState.ALIVE, mm.MemberState.SUSPECT, mm.MemberState.DEAD, mm.MemberState.LEFT]
_STATE_NUM = {s: i for i, s in enumerate(_STATES)}

# oneof field name for each core message type
_FIELD: dict[type, str] = {
    mm.Ping: "ping", mm.Ack: "ack", mm.PingReq: "ping_req", mm.Nack: "nack", mm.Gossip: "gossip",
    mm.PushPull: "push_pull", rm.VoteRequest: "vote_request", rm.VoteResponse: "vote_response",
    rm.AppendRequest: "append_request", rm.AppendResponse: "append_response",
    rm.RaftHeartbeat: "raft_heartbeat", rm.RaftHeartbeatResponse: "raft_heartbeat_response",
    rm.SnapshotRequest: "snapshot_request",
}


def _hb_out(hb: mm.Heartbeat) -> pb.Heartbeat:
    return pb.Heartbeat(node_id=hb.node_id, addr=hb.addr, incarnation=hb.incarnation, term=hb.term,
                        last_applied=hb.last_applied, commit_index=hb.commit_index, sent_at=hb.sent_at)


def _hb_in(hb: pb.Heartbeat) -> mm.Heartbeat:
    return mm.Heartbeat(hb.node_id, hb.addr, hb.incarnation, hb.term, hb.last_applied, hb.commit_index, hb.sent_at)


def _update_out(u: mm.Update) -> pb.MemberUpdate:
    return pb.MemberUpdate(state=_STATE_NUM[u.state], node_id=u.node_id, addr=u.addr,
                           incarnation=u.incarnation, origin=u.origin, refused=u.refused)


def _state_in(value: int) -> mm.MemberState:
    if not 0 <= value < len(_STATES):
        raise BadRequest(f"unknown member state {value}")
    return _STATES[value]


def _update_in(u: pb.MemberUpdate) -> mm.Update:
    return mm.Update(_state_in(u.state), u.node_id, u.addr, u.incarnation, u.origin, u.refused)


def record_out(r: mm.MemberRecord) -> pb.MemberRecord:
    """A membership table row on the wire."""
    return pb.MemberRecord(node_id=r.node_id, addr=r.addr, state=_STATE_NUM[r.state], incarnation=r.incarnation,
                           term=r.term, last_applied=r.last_applied, commit_index=r.commit_index)


def record_in(r: pb.MemberRecord) -> mm.MemberRecord:
    """A membership table row from the wire (validate() before use)."""
    return mm.MemberRecord(r.node_id, r.addr, _state_in(r.state), r.incarnation, r.term, r.last_applied, r.commit_index)


def entry_out(e: Entry) -> pb.Entry:
    """A log entry on the wire, payload as msgpack bytes."""
    index, term, kind, payload = entry_to_wire(e)
    return pb.Entry(index=index, term=term, kind=kind, payload=payload)


def entry_in(e: pb.Entry) -> Entry:
    """A validated log entry from the wire."""
    try:
        return entry_from_wire(e.index, e.term, e.kind, e.payload)
    except CorruptEntry as exc:
        raise BadRequest(str(exc)) from None


def _entries_in(items: Any) -> tuple[Entry, ...]:
    entry_count(len(items))  # before decoding any of them
    return tuple(entry_in(e) for e in items)


def _updates_in(items: Any) -> tuple[mm.Update, ...]:
    if len(items) > mm.MAX_UPDATES:
        raise BadRequest(f"{len(items)} piggybacked updates, at most {mm.MAX_UPDATES}")
    return tuple(_update_in(u) for u in items)


_ENCODE: dict[type, Callable[[Any], Any]] = {
    mm.Ping: lambda m: pb.Ping(seq=m.seq, target=m.target, hb=_hb_out(m.hb), updates=[_update_out(u) for u in m.updates]),
    mm.Ack: lambda m: pb.Ack(seq=m.seq, hb=_hb_out(m.hb), updates=[_update_out(u) for u in m.updates]),
    mm.PingReq: lambda m: pb.PingReq(seq=m.seq, target=m.target, target_addr=m.target_addr, hb=_hb_out(m.hb),
                                     updates=[_update_out(u) for u in m.updates]),
    mm.Nack: lambda m: pb.Nack(seq=m.seq, hb=_hb_out(m.hb)),
    mm.Gossip: lambda m: pb.Gossip(hb=_hb_out(m.hb), updates=[_update_out(u) for u in m.updates]),
    mm.PushPull: lambda m: pb.PushPull(hb=_hb_out(m.hb), members=[record_out(r) for r in m.members],
                                       join=m.join, reply=m.reply),
    rm.VoteRequest: lambda m: pb.VoteRequest(term=m.term, candidate=m.candidate, last_index=m.last_index,
                                             last_term=m.last_term, pre_vote=m.pre_vote),
    rm.VoteResponse: lambda m: pb.VoteResponse(term=m.term, granted=m.granted, pre_vote=m.pre_vote, reason=m.reason),
    rm.AppendRequest: lambda m: pb.AppendRequest(term=m.term, leader=m.leader, prev_index=m.prev_index,
                                                 prev_term=m.prev_term, entries=[entry_out(e) for e in m.entries],
                                                 commit=m.commit),
    rm.AppendResponse: lambda m: pb.AppendResponse(term=m.term, success=m.success, match_index=m.match_index,
                                                   reject_hint=m.reject_hint, reject_term=m.reject_term),
    rm.RaftHeartbeat: lambda m: pb.RaftHeartbeat(term=m.term, leader=m.leader, commit=m.commit, read_seq=m.read_seq,
                                               idle=m.idle),
    rm.RaftHeartbeatResponse: lambda m: pb.RaftHeartbeatResponse(term=m.term, read_seq=m.read_seq),
    rm.SnapshotRequest: lambda m: pb.SnapshotRequest(term=m.term, leader=m.leader, index=m.index,
                                                     term_of_index=m.term_of_index, data=m.data,
                                                     voters=list(m.voters), learners=list(m.learners),
                                                     uids=dict(m.uids), epoch=m.epoch, forced_at=m.forced_at),
}

_DECODE: dict[str, Callable[[Any], Any]] = {
    "ping": lambda b: mm.Ping(b.seq, b.target, _hb_in(b.hb), _updates_in(b.updates)),
    "ack": lambda b: mm.Ack(b.seq, _hb_in(b.hb), _updates_in(b.updates)),
    "ping_req": lambda b: mm.PingReq(b.seq, b.target, b.target_addr, _hb_in(b.hb), _updates_in(b.updates)),
    "nack": lambda b: mm.Nack(b.seq, _hb_in(b.hb)),
    "gossip": lambda b: mm.Gossip(_hb_in(b.hb), _updates_in(b.updates)),
    "push_pull": lambda b: mm.PushPull(_hb_in(b.hb), tuple(record_in(r) for r in b.members), b.join, b.reply),
    "vote_request": lambda b: rm.VoteRequest(b.term, b.candidate, b.last_index, b.last_term, b.pre_vote),
    "vote_response": lambda b: rm.VoteResponse(b.term, b.granted, b.pre_vote, b.reason),
    "append_request": lambda b: rm.AppendRequest(b.term, b.leader, b.prev_index, b.prev_term,
                                                 _entries_in(b.entries), b.commit),
    "append_response": lambda b: rm.AppendResponse(b.term, b.success, b.match_index, b.reject_hint, b.reject_term),
    "raft_heartbeat": lambda b: rm.RaftHeartbeat(b.term, b.leader, b.commit, b.read_seq, b.idle),
    "raft_heartbeat_response": lambda b: rm.RaftHeartbeatResponse(b.term, b.read_seq),
    "snapshot_request": lambda b: rm.SnapshotRequest(b.term, b.leader, b.index, b.term_of_index, bytes(b.data),
                                                     tuple(b.voters), tuple(b.learners), tuple(sorted(b.uids.items())),
                                                     b.epoch, b.forced_at),
}


def encode(envelope: Envelope) -> pb.Envelope:
    """The wire Envelope of a core message and its sender's header."""
    msg, peer = envelope.msg, envelope.sender
    return pb.Envelope(from_id=peer.node_id, from_addr=envelope.from_addr, from_uid=peer.uid, from_epoch=peer.epoch,
                       to_uid=envelope.to_uid, from_boot=envelope.boot, from_up=envelope.up,
                       **{_FIELD[type(msg)]: _ENCODE[type(msg)](msg)})


def decode(envelope: pb.Envelope) -> Envelope:
    """The validated core message inside a wire Envelope, with its header; BadRequest when anything is off."""
    field = envelope.WhichOneof("body")
    if field is None:
        raise BadRequest("the envelope carries no message")
    if not envelope.from_id or len(envelope.from_id) > mm.MAX_NODE_ID:
        raise BadRequest("the envelope has no valid sender id")
    msg = _DECODE[field](getattr(envelope, field))
    peer = rm.Peer(envelope.from_id, envelope.from_uid, envelope.from_epoch)
    decoded = Envelope(msg, peer, envelope.from_addr, envelope.to_uid, envelope.from_boot, envelope.from_up)
    check(decoded)
    return decoded
