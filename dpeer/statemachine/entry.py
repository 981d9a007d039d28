"""Log entries and their byte encodings: the LMDB key/value form and the wire form.

Pure: no lmdb, asyncio, grpc, torch or clock. A stored value is msgpack ``[term, kind, payload,
crc32]`` where the CRC covers the msgpack of ``[term, kind, payload]``.
"""

from __future__ import annotations

import enum
import hashlib
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import msgpack

from dpeer.statemachine.errors import CorruptEntry, LogGapError

_KEY = struct.Struct(">Q")
_MAX_INDEX = (1 << 64) - 1
_CRC_93 = zlib.crc32(b"\x93")  # CRC of the 3-element array header the CRC covers


class EntryKind(enum.StrEnum):
    """What a log entry records; the value is the string stored on disk and sent on the wire."""

    MEMBER_JOINED = "member_joined"
    MEMBER_LEFT = "member_left"
    MEMBER_DEAD = "member_dead"
    VIEW = "view"
    CHECKPOINT = "checkpoint"
    KV_PUT = "kv_put"
    KV_DELETE = "kv_delete"
    NOOP = "noop"
    CONFIG_CHANGE = "config_change"
    JOB = "job"
    CONTROL = "control"


MAX_KEY, MAX_VALUE = 256, 64 * 1024
"""A kv key's most characters and a value's: the service refuses longer, the CLI before it dials."""

_KINDS: dict[str, EntryKind] = {k.value: k for k in EntryKind}


@dataclass(frozen=True, slots=True)
class Entry:
    """One replicated log entry: its position, the term it was proposed in, and what it records."""

    index: int
    term: int
    kind: EntryKind
    payload: dict[str, Any]


def encode_key(index: int) -> bytes:
    """Big-endian u64 so LMDB's byte order is index order (and append=True puts stay valid)."""
    if not 0 <= index <= _MAX_INDEX:
        raise ValueError(f"log index {index} is outside 0..2**64-1")
    return _KEY.pack(index)


def decode_key(key: bytes) -> int:
    """Inverse of encode_key; a key of the wrong length is corruption."""
    if len(key) != 8:
        raise CorruptEntry(f"log key has {len(key)} bytes, expected 8")
    return _KEY.unpack(key)[0]


def pack_payload(payload: Mapping[str, Any]) -> bytes:
    """Msgpack a payload dict, e.g. for the wire's payload-bytes field."""
    return msgpack.packb(dict(payload), use_bin_type=True)


def unpack_payload(data: bytes) -> dict[str, Any]:
    """Inverse of pack_payload; raises CorruptEntry unless the bytes hold a dict with str keys."""
    try:
        payload = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise CorruptEntry(f"payload bytes are not valid msgpack: {exc}") from exc
    try:
        _check_payload_dict(payload)
    except ValueError as exc:
        raise CorruptEntry(str(exc)) from exc
    return payload


def encode_entry(entry: Entry) -> bytes:
    """Encode an entry's value (the index lives in the key) with a CRC over term, kind, payload."""
    _check_fields(entry.index, entry.term, entry.kind, entry.payload)
    body = msgpack.packb([entry.term, entry.kind.value, entry.payload], use_bin_type=True)
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
    return msgpack.packb([entry.index, entry.term, entry.kind.value, _canonical(entry.payload)],
                         use_bin_type=True)


def entry_digest(entry: Entry) -> str:
    """sha256 of canonical_bytes, hex: what `dpeer log` prints to compare committed prefixes."""
    return hashlib.sha256(canonical_bytes(entry)).hexdigest()


def entry_to_wire(entry: Entry) -> tuple[int, int, str, bytes]:
    """The transport's form of an entry: (index, term, kind string, msgpack payload bytes)."""
    _check_fields(entry.index, entry.term, entry.kind, entry.payload)
    return entry.index, entry.term, entry.kind.value, pack_payload(entry.payload)


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


def _check_fields(index: Any, term: Any, kind: Any, payload: Any) -> None:
    """Shape checks shared by every encoder and decoder (types, ranges)."""
    if type(index) is not int or not 1 <= index <= _MAX_INDEX:
        raise ValueError(f"index must be an int in 1..2**64-1, got {index!r}")
    if type(term) is not int or not 0 <= term <= _MAX_INDEX:
        raise ValueError(f"term must be an int in 0..2**64-1, got {term!r}")
    if not isinstance(kind, EntryKind):
        raise ValueError(f"kind must be an EntryKind, got {kind!r}")
    _check_payload_dict(payload)


def _check_payload_dict(payload: Any) -> None:
    """A payload is a dict keyed by strings; what its fields mean is payloads.py's concern."""
    if type(payload) is not dict or not all(type(k) is str for k in payload):
        raise ValueError(f"payload must be a dict with str keys, got {type(payload).__name__}")


def check_contiguous(entries: Sequence[Entry]) -> list[Entry]:
    """The entries as a list; raises LogGapError unless indices are consecutive and terms never drop."""
    out = list(entries)
    for a, b in zip(out, out[1:]):
        if b.index != a.index + 1:
            raise LogGapError(f"entries are not contiguous: {a.index} then {b.index}")
        if b.term < a.term:
            raise LogGapError(f"entry {b.index} has term {b.term} below entry {a.index}'s {a.term}")
    return out
