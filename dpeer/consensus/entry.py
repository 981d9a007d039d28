"""The replicated log's entry: a position, a term, and an application record the core never reads.

An entry's kind is opaque here: a string the application defines (statemachine/entry.py lists its
kinds, these two among them). The core knows only its own kinds, `RaftKind`: the configuration
changes it decodes itself (voting.py) and the no-op a new leader appends. A payload is a dict
keyed by strings that msgpack can carry; what its fields mean is the application's concern.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Mapping

import msgpack

MAX_INDEX = (1 << 64) - 1


class RaftKind(StrEnum):
    """The entry kinds consensus itself writes and reads."""

    CONFIG_CHANGE = "config_change"
    NOOP = "noop"


@dataclass(frozen=True, slots=True)
class Entry:
    """One replicated log entry: its position, the term it was proposed in, and what it records
    (kind: a RaftKind or one of the application's kinds, payload: opaque to the core)."""

    index: int
    term: int
    kind: str
    payload: dict[str, Any]


def pack_payload(payload: Mapping[str, Any]) -> bytes:
    """Msgpack a payload dict, e.g. for the wire's payload-bytes field."""
    return msgpack.packb(dict(payload), use_bin_type=True)


def entry_size(entry: Entry) -> int:
    """Approximate encoded size of an entry, for max_bytes limits."""
    return 24 + len(entry.kind) + len(pack_payload(entry.payload))


def check_fields(index: Any, term: Any, kind: Any, payload: Any) -> None:
    """Raise ValueError unless index and term are in range, kind is a non-empty string and payload
    a dict keyed by strings (shape checks shared by every encoder and decoder)."""
    if type(index) is not int or not 1 <= index <= MAX_INDEX:
        raise ValueError(f"index must be an int in 1..2**64-1, got {index!r}")
    if type(term) is not int or not 0 <= term <= MAX_INDEX:
        raise ValueError(f"term must be an int in 0..2**64-1, got {term!r}")
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"kind must be a non-empty string, got {kind!r}")
    check_payload_dict(payload)


def check_payload_dict(payload: Any) -> None:
    """A payload is a dict keyed by strings; raise ValueError for anything else."""
    if type(payload) is not dict or not all(type(k) is str for k in payload):
        raise ValueError(f"payload must be a dict with str keys, got {type(payload).__name__}")


def storable(entry: Entry) -> None:
    """Raise ValueError (or msgpack's TypeError/OverflowError) unless the entry can be stored and
    sent: the shape checks, and a payload msgpack can encode."""
    check_fields(entry.index, entry.term, entry.kind, entry.payload)
    pack_payload(entry.payload)
