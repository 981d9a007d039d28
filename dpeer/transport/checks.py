"""What every envelope passes on its way in, whichever transport carried it.

The gRPC transport decodes protobuf (codec.py), then checks; the in-memory network (memory.py)
hands its envelope over the way the wire would (log entries rebuilt from their encoded form, so
no two daemons share an entry object), then checks the same. A message a core sends that the
wire would refuse is then refused in the simulation too, instead of passing there unseen.
Pure: no protobuf, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import re

from dpeer.consensus import messages as rm
from dpeer.errors import BadRequest
from dpeer.membership import messages as mm
from dpeer.statemachine.entry import entry_from_wire, entry_to_wire
from dpeer.statemachine.errors import CorruptEntry
from dpeer.transport.api import BOOT_DIGITS, MAX_UP, Envelope, valid_boot
from dpeer.transport.calls import EntryChunk

MAX_ENTRIES_PER_MESSAGE = 10_000


def entry_count(count: int) -> None:
    """BadRequest when one message carries more entries than a receiver takes."""
    if count > MAX_ENTRIES_PER_MESSAGE:
        raise BadRequest(f"{count} entries in one message, at most {MAX_ENTRIES_PER_MESSAGE}")


def wire_name(msg: object) -> str:
    """A message's name as the wire's Envelope names its field (AppendRequest: append_request),
    the name refusals have always given (operators' logs, refusal counts)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(msg).__name__).lower()


def check(envelope: Envelope) -> None:
    """BadRequest saying what is off in an envelope a peer sent: its sender's id and identity,
    the message's fields (the cores' validate()), its entry count, the daemon's boot and age."""
    msg, peer = envelope.msg, envelope.sender
    if not isinstance(peer.node_id, str) or not peer.node_id or len(peer.node_id) > mm.MAX_NODE_ID:
        raise BadRequest("the envelope has no valid sender id")
    if isinstance(msg, rm.AppendRequest):
        entry_count(len(msg.entries))
    try:
        msg.validate()
    except (mm.InvalidMessage, rm.InvalidRaftMessage) as exc:
        raise BadRequest(f"invalid {wire_name(msg)}: {exc}") from None
    try:
        peer.validate()
    except rm.InvalidRaftMessage as exc:
        raise BadRequest(f"the envelope's sender identity is invalid: {exc}") from None
    if not valid_boot(envelope.boot):
        raise BadRequest(f"the envelope's from_boot must be {BOOT_DIGITS} lowercase hex digits")
    if not (math.isfinite(envelope.up) and 0.0 <= envelope.up <= MAX_UP):
        raise BadRequest(f"the envelope's from_up must be seconds in 0..{MAX_UP:g}")


def carried(envelope: Envelope) -> Envelope:
    """The envelope as the wire delivers it: an AppendRequest's entries encoded and rebuilt (the
    receiver's own objects, validated as codec.entry_in validates them); BadRequest when an entry
    does not survive the trip."""
    msg = envelope.msg
    if not isinstance(msg, rm.AppendRequest) or not msg.entries:
        return envelope
    entry_count(len(msg.entries))
    return dataclasses.replace(envelope, msg=dataclasses.replace(msg, entries=_rebuilt(msg.entries)))


def carried_chunk(chunk: object) -> object:
    """A streamed reply as the wire delivers it: an EntryChunk's entries encoded and rebuilt
    (BadRequest when one does not survive), any other chunk as it is. No entry count here: a
    chunk is bounded by its bytes (service.CHUNK_BYTES), and the gRPC client takes any count
    (a megabyte of small entries is tens of thousands)."""
    if not isinstance(chunk, EntryChunk):
        return chunk
    return dataclasses.replace(chunk, entries=_rebuilt(chunk.entries))


def _rebuilt(entries: tuple) -> tuple:
    try:
        return tuple(entry_from_wire(*entry_to_wire(e)) for e in entries)
    except (CorruptEntry, ValueError, TypeError) as exc:
        raise BadRequest(f"an entry the wire would not carry: {exc}") from None
