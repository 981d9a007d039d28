"""The store's `meta` record: format version, identity, hard state and log bounds.

Pure: parsing and checking of the raw key/value pairs read from the `meta` sub-db, so the LMDB
driver stays small and every rule here can be tested without a disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import msgpack

from dpeer.ids import valid_uid
from dpeer.statemachine.errors import StoreFormatError

__all__ = ["FORMAT_VERSION", "BadMeta", "Meta", "check_version", "decode_raw", "encode_value", "parse_meta",
           "salvage", "valid_uid"]

FORMAT_VERSION = 1


class BadMeta(Exception):
    """The meta record is missing fields or breaks an invariant; the store cannot be trusted."""


@dataclass(slots=True)
class Meta:
    """Decoded meta fields; the Store keeps one in memory as its cache of what is on disk.

    uid is the store's identity, drawn once when the store is created (a wiped or replaced disk
    gets a new one): the node id names the box, the uid names the log and votes it holds."""

    node_id: str
    uid: str
    current_term: int = 0
    voted_for: str | None = None
    commit_index: int = 0
    last_applied: int = 0
    snapshot_index: int = 0
    snapshot_term: int = 0
    first_index: int = 1

    def fields(self) -> dict[str, Any]:
        """Every field plus the format version, as written to the `meta` sub-db."""
        return {
            "format_version": FORMAT_VERSION,
            "node_id": self.node_id,
            "uid": self.uid,
            "current_term": self.current_term,
            "voted_for": self.voted_for,
            "commit_index": self.commit_index,
            "last_applied": self.last_applied,
            "snapshot_index": self.snapshot_index,
            "snapshot_term": self.snapshot_term,
            "first_index": self.first_index,
        }


_INT_FIELDS = (
    "current_term", "commit_index", "last_applied", "snapshot_index", "snapshot_term", "first_index",
)


def encode_value(value: Any) -> bytes:
    """Msgpack one meta value."""
    return msgpack.packb(value, use_bin_type=True)


def decode_raw(raw: Mapping[bytes, bytes]) -> dict[str, Any]:
    """Decode the raw sub-db pairs to {name: value}; raises BadMeta on undecodable bytes."""
    out = {}
    for k, v in raw.items():
        try:
            out[k.decode()] = msgpack.unpackb(v, raw=False)
        except Exception as exc:  # msgpack/UnicodeDecodeError raise unrelated types
            raise BadMeta(f"meta field {k!r} is not decodable: {exc}") from exc
    return out


def check_version(fields: Mapping[str, Any]) -> None:
    """Raise StoreFormatError for a newer format, BadMeta for a missing or malformed version."""
    fv = fields.get("format_version")
    if type(fv) is not int or fv < 1:
        raise BadMeta(f"meta format_version is {fv!r}")
    if fv > FORMAT_VERSION:
        raise StoreFormatError(
            f"store format version {fv} is newer than this dpeer supports ({FORMAT_VERSION}); "
            "upgrade dpeer to open it (the store was left untouched)"
        )


def parse_meta(fields: Mapping[str, Any]) -> Meta:
    """Build a Meta from decoded fields, checking types and the ordering invariants."""
    nid = fields.get("node_id")
    if type(nid) is not str or not nid:
        raise BadMeta(f"meta node_id is {nid!r}")
    uid = fields.get("uid")
    if not valid_uid(uid):
        raise BadMeta(f"meta uid is {uid!r}")
    vals = {}
    for name in _INT_FIELDS:
        v = fields.get(name)
        if type(v) is not int or v < 0:
            raise BadMeta(f"meta {name} is {v!r}")
        vals[name] = v
    vote = fields.get("voted_for")
    if vote is not None and (type(vote) is not str or not vote):
        raise BadMeta(f"meta voted_for is {vote!r}")
    m = Meta(nid, uid, voted_for=vote, **vals)
    if not m.snapshot_index <= m.last_applied <= m.commit_index:
        raise BadMeta(
            f"meta breaks snapshot_index <= last_applied <= commit_index "
            f"({m.snapshot_index}, {m.last_applied}, {m.commit_index})"
        )
    if not 1 <= m.first_index <= m.snapshot_index + 1:
        raise BadMeta(f"meta first_index {m.first_index} outside 1..snapshot_index+1")
    return m


def salvage(fields: Mapping[str, Any]) -> tuple[str | None, int, str | None]:
    """Best-effort (node_id, term, vote) from a broken store, so a fresh one never votes twice."""
    nid = fields.get("node_id")
    term = fields.get("current_term")
    vote = fields.get("voted_for")
    nid = nid if type(nid) is str and nid else None
    if type(term) is not int or term < 0:
        return nid, 0, None
    return nid, term, vote if type(vote) is str and vote else None
