"""Converts the Peer service's calls (transport/calls.py) to the wire's protobuf messages and back.

Each dataclass in calls.py has a protobuf message of the same name and fields; a field whose
default is None is an optional one there (None: unset). Log entries and membership rows go through
codec.py (decoding validates them and raises BadRequest).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.transport import calls, codec

# the fields that hold messages, by dataclass: how one item goes out and comes in
_ITEMS: dict[tuple[type, str], tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    (calls.EntryChunk, "entries"): (codec.entry_out, codec.entry_in),
    (calls.JoinReply, "members"): (codec.record_out, codec.record_in),
    (calls.KvListReply, "pairs"): (lambda p: pb.KvPair(key=p.key, value=p.value),
                                   lambda p: calls.KvPair(p.key, p.value)),
}


def to_wire(call: Any) -> Any:
    """The protobuf message of a request or reply from calls.py."""
    kind = type(call)
    fields = {}
    for f in dataclasses.fields(kind):
        value = getattr(call, f.name)
        if value is None:
            continue  # an optional field left unset
        items = _ITEMS.get((kind, f.name))
        fields[f.name] = [items[0](v) for v in value] if items else list(value) if isinstance(value, tuple) else value
    return getattr(pb, kind.__name__)(**fields)


def from_wire(kind: type, message: Any) -> Any:
    """The calls.py dataclass `kind` of a protobuf message; BadRequest when an entry is invalid."""
    fields = {}
    for f in dataclasses.fields(kind):
        value = getattr(message, f.name)
        items = _ITEMS.get((kind, f.name))
        if f.default is None and not message.HasField(f.name):
            value = None
        elif items:
            value = tuple(items[1](v) for v in value)
        elif not isinstance(value, (str, bytes, bool, int, float)):
            value = tuple(value)  # a repeated scalar field
        fields[f.name] = value
    return kind(**fields)


def parsed(message: Any) -> Any:
    """The calls.py dataclass of a reply or chunk from the wire (the one of the same name)."""
    return from_wire(getattr(calls, type(message).__name__), message)
