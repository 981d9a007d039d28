"""Transaction-level helpers of the store: meta records, log ranges, and the open-time checks.

They take an open LMDB transaction from store.py (the only module that imports lmdb) and never
open one themselves, so this file needs no lmdb import; `Txn` names that object.
"""

from __future__ import annotations

from typing import Any

from dpeer.statemachine.entry import decode_entry, decode_key, encode_key
from dpeer.statemachine.errors import CorruptEntry
from dpeer.statemachine.meta import BadMeta, Meta, encode_value
from dpeer.statemachine.snapshot import decode_snapshot
from dpeer.statemachine.state import ClusterState, decode_state

Txn = Any
"""An lmdb.Transaction opened by store.py."""

TAIL_CHECK = 4096  # newest entries, and next entries to apply, whose CRC is checked at open
TORN_ZEROS = 8  # zero bytes that end a torn write: where the disk stopped, nothing was written
STATE_KEY = b"applied"
SNAP_KEY = b"current"


def put_meta(txn: Txn, dbs: dict[str, Any], fields: dict[str, Any]) -> None:
    """Write meta fields (msgpack values) in txn."""
    for name, value in fields.items():
        txn.put(name.encode(), encode_value(value), db=dbs["meta"])


def delete_range(txn: Txn, db: Any, lo: int | None, hi: int | None) -> None:
    """Delete log keys in [lo, hi) (None: unbounded)."""
    cur = txn.cursor(db=db)
    found = cur.set_range(encode_key(lo)) if lo is not None else cur.first()
    stop = encode_key(hi) if hi is not None else None
    while found and (stop is None or cur.key() < stop):
        found = cur.delete() and bool(cur.key())


def torn_tail(txn: Txn, db: Any, meta: Meta) -> int | None:
    """The index of a torn last entry, or None: one that fails its checks, ends in TORN_ZEROS or
    more zero bytes (a write cut short at power loss: past the tear nothing reached the disk; a
    damaged byte leaves no such run) and lies beyond the commit index and the applied index, so it
    is an uncommitted tail whose write never returned, hence was never acknowledged (etcd's WAL
    repairs a torn tail the same way). Any other bad entry is damage, left to check_contents."""
    cur = txn.cursor(db=db)
    if not cur.last():
        return None
    index, value = decode_key(cur.key()), bytes(cur.value())
    if index <= max(meta.commit_index, meta.last_applied, meta.snapshot_index) or index < meta.first_index:
        return None
    if len(value) <= TORN_ZEROS or any(value[-TORN_ZEROS:]):
        return None
    try:
        decode_entry(index, value)
    except CorruptEntry:
        return index
    return None


def check_contents(txn: Txn, dbs: dict[str, Any],
                    meta: Meta) -> tuple[tuple[int, int], ClusterState]:
    """Check the log bounds, tail CRCs, state and snapshot against meta; returns (last index,
    last term) and the applied state."""
    db = dbs["log"]
    cur = txn.cursor(db=db)
    if cur.first():
        first = decode_key(cur.key())
        cur.last()
        last = decode_key(cur.key())
        if first != meta.first_index or txn.stat(db)["entries"] != last - first + 1:
            raise BadMeta(f"log holds {txn.stat(db)['entries']} entries in {first}..{last}, "
                          f"meta first_index {meta.first_index}")
        nxt = meta.last_applied + 1  # the next entries to apply, and the newest ones, are checked
        spans = [(nxt, min(last, nxt + TAIL_CHECK - 1)), (max(first, last - TAIL_CHECK + 1), last)]
        terms = {i: decode_entry(i, v).term for lo, hi in spans for i, v in scan(txn, db, lo, hi)}
        last_term = terms[last]
    else:
        if meta.first_index != meta.snapshot_index + 1:
            raise BadMeta(f"empty log but first_index {meta.first_index} != snapshot_index + 1")
        last, last_term, terms = meta.snapshot_index, meta.snapshot_term, {}
    if meta.commit_index > last:
        raise BadMeta(f"commit index {meta.commit_index} beyond last log index {last}")
    if terms.get(meta.snapshot_index, meta.snapshot_term) != meta.snapshot_term:
        raise BadMeta("the log's term at the snapshot index disagrees with meta")
    state = decode_state(txn.get(STATE_KEY, db=dbs["state"]) or b"")
    if state.applied_index != meta.last_applied:
        raise BadMeta(f"state is at {state.applied_index}, meta says last_applied {meta.last_applied}")
    if meta.snapshot_index:
        decode_snapshot(meta.snapshot_index, meta.snapshot_term,
                        bytes(txn.get(SNAP_KEY, db=dbs["snap"]) or b""))
    return (last, last_term), state


def scan(txn: Txn, db: Any, lo: int, hi: int) -> list[tuple[int, bytes]]:
    """(index, value) for keys lo..hi inclusive, checking there is no hole."""
    cur = txn.cursor(db=db)
    out: list[tuple[int, bytes]] = []
    if lo > hi:
        return out
    if cur.set_key(encode_key(lo)):
        for i, (k, v) in enumerate(cur.iternext(), lo):
            if i > hi:
                break
            if decode_key(k) != i:
                raise CorruptEntry(f"log has a hole at {i}")
            out.append((i, v))
    if len(out) != hi - lo + 1:
        raise CorruptEntry(f"log is missing entries in {lo}..{hi}")
    return out
