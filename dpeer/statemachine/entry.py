"""The state machine's entry kinds and the entries' byte encodings: the LMDB key/value form and
the wire form.

The entry type is consensus's (consensus/entry.py), with an opaque kind: the kinds are defined
here, on top of the two consensus writes itself (RaftKind). Pure: no lmdb, asyncio, grpc, torch
or clock. A stored value is msgpack ``[term, kind, payload, crc32]`` where the CRC covers the
msgpack of ``[term, kind, payload]``.
"""

from __future__ import annotations

import enum
import hashlib
import struct
import zlib
from typing import Any, Sequence

import msgpack

from dpeer.consensus.entry import MAX_INDEX, Entry, RaftKind, check_fields, check_payload_dict, pack_payload
from dpeer.statemachine.errors import CorruptEntry, LogGapError

__all__ = [
    "MAX_KEY", "MAX_VALUE", "Entry", "EntryKind", "canonical_bytes", "check_contiguous", "decode_entry",
    "decode_key", "encode_entry", "encode_key", "entry_digest", "entry_from_wire", "entry_to_wire",
    "pack_payload", "unpack_payload",
]

_KEY = struct.Struct(">Q")
_CRC_93 = zlib.crc32(b"\x93")  # CRC of the 3-element array header the CRC covers


class EntryKind(enum.StrEnum):
    """What a log entry records; the value is the string stored on disk and sent on the wire.
    NOOP and CONFIG_CHANGE are consensus's own kinds (RaftKind), with the same values."""

    MEMBER_JOINED = "member_joined"
    MEMBER_LEFT = "member_left"
    MEMBER_DEAD = "member_dead"
    VIEW = "view"
    CHECKPOINT = "checkpoint"
    KV_PUT = "kv_put"
    KV_DELETE = "kv_delete"
    NOOP = RaftKind.NOOP.value
    CONFIG_CHANGE = RaftKind.CONFIG_CHANGE.value
    JOB = "job"
    CONTROL = "control"


MAX_KEY, MAX_VALUE = 256, 64 * 1024
"""A kv key's most characters and a value's: the service refuses longer, the CLI before it dials."""

_KINDS: dict[str, EntryKind] = {k.value: k for k in EntryKind}


def encode_key(index: int) -> bytes:
    """Big-endian u64 so LMDB's byte order is index order (and append=True puts stay valid)."""
    if not 0 <= index <= MAX_INDEX:
        raise ValueError(f"log index {index} is outside 0..2**64-1")
    return _KEY.pack(index)


def decode_key(key: bytes) -> int:
    """Inverse of encode_key; a key of the wrong length is corruption."""
    if len(key) != 8:
        raise CorruptEntry(f"log key has {len(key)} bytes, expected 8")
    return _KEY.unpack(key)[0]


def unpack_payload(data: bytes) -> dict[str, Any]:
    """Inverse of pack_payload; raises CorruptEntry unless the bytes hold a dict with str keys."""
    try:
        payload = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise CorruptEntry(f"payload bytes are not valid msgpack: {exc}") from exc
    try:
        check_payload_dict(payload)
    except ValueError as exc:
        raise CorruptEntry(str(exc)) from exc
    return payload


def encode_entry(entry: Entry) -> bytes:
    """Encode an entry's value (the index lives in the key) with a CRC over term, kind, payload."""
    kind = _check_fields(entry.index, entry.term, entry.kind, entry.payload)
    body = msgpack.packb([entry.term, kind.value, entry.payload], use_bin_type=True)
    crc = zlib.crc32(body)
    # body starts with the 3-element array header 0x93; the stored value is a 4-element array.
    return b"\x94" + body[1:] + msgpack.packb(crc)


def decode_entry(index: int, value: bytes) -> Entry:
    """Decode and verify a stored value; raises CorruptEntry with the index on any mismatch."""
    try:
        term, kind, payload, crc = msgpack.unpackb(value, raw=False, strict_map_key=True)
        tail, view = _crc_trailer(crc), memoryview(value)
        crc_ok = (value[0] == 0x94 and view[-len(tail):] == tail
                  and zlib.crc32(view[1 : -len(tail)], _CRC_93) == crc)
    except Exception as exc:  # msgpack and unpacking raise several unrelated types on bad input
        raise CorruptEntry(f"entry {index}: value is not msgpack [term, kind, payload, crc32] ({exc!r})") from exc
    if not crc_ok:
        raise CorruptEntry(f"entry {index}: CRC mismatch (stored {crc!r})")
    kind_enum = _KINDS.get(kind) if type(kind) is str else None
    # Bytes that pass the CRC are the bytes encode_entry wrote after its field checks; these
    # checks only guard against a CRC collision on damaged data.
    if kind_enum is None or type(term) is not int or term < 0 or type(payload) is not dict:
        raise CorruptEntry(f"entry {index}: bad fields (term {term!r}, kind {kind!r})")
    return Entry(index, term, kind_enum, payload)


def _crc_trailer(n: int) -> bytes:
    """The bytes encode_entry writes for the CRC: msgpack's shortest form of a u32. A stored
    trailer in any other form (int32 instead of uint32, say) is damage even though it decodes to
    the same number, so every flipped byte of a value is detected."""
    if type(n) is not int or not 0 <= n < 1 << 32:
        raise ValueError(f"crc {n!r} is not a u32")
    return msgpack.packb(n)


def _canonical(value: Any) -> Any:
    """The value with every map's keys sorted, so equal payloads pack to equal bytes."""
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def canonical_bytes(entry: Entry) -> bytes:
    """An entry's canonical bytes: msgpack [index, term, kind, payload], map keys sorted. Two
    nodes hold the same entry at an index exactly when these bytes are equal."""
    return msgpack.packb([entry.index, entry.term, str(entry.kind), _canonical(entry.payload)],
                         use_bin_type=True)


def entry_digest(entry: Entry) -> str:
    """sha256 of canonical_bytes, hex: what `dpeer log` prints to compare committed prefixes."""
    return hashlib.sha256(canonical_bytes(entry)).hexdigest()


def entry_to_wire(entry: Entry) -> tuple[int, int, str, bytes]:
    """The transport's form of an entry: (index, term, kind string, msgpack payload bytes)."""
    kind = _check_fields(entry.index, entry.term, entry.kind, entry.payload)
    return entry.index, entry.term, kind.value, pack_payload(entry.payload)


def entry_from_wire(index: int, term: int, kind: str, payload: bytes) -> Entry:
    """Rebuild and validate an entry received from a peer; raises CorruptEntry on bad fields."""
    kind_enum = _KINDS.get(kind) if type(kind) is str else None
    if kind_enum is None:
        raise CorruptEntry(f"entry {index}: unknown kind {kind!r}")
    body = unpack_payload(payload)
    try:
        _check_fields(index, term, kind_enum, body)
    except ValueError as exc:
        raise CorruptEntry(f"entry {index}: {exc}") from exc
    return Entry(index, term, kind_enum, body)


def _check_fields(index: Any, term: Any, kind: Any, payload: Any) -> EntryKind:
    """Shape checks shared by every encoder and decoder (types, ranges), and a kind this state
    machine defines (an EntryKind, or consensus's RaftKind of the same value); returns it."""
    check_fields(index, term, kind, payload)
    known = _KINDS.get(kind)
    if known is None:
        raise ValueError(f"kind must be an EntryKind, got {kind!r}")
    return known


def check_contiguous(entries: Sequence[Entry]) -> list[Entry]:
    """The entries as a list; raises LogGapError unless indices are consecutive and terms never drop."""
    out = list(entries)
    for a, b in zip(out, out[1:]):
        if b.index != a.index + 1:
            raise LogGapError(f"entries are not contiguous: {a.index} then {b.index}")
        if b.term < a.term:
            raise LogGapError(f"entry {b.index} has term {b.term} below entry {a.index}'s {a.term}")
    return out
