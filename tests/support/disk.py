"""The simulated disk's faults beyond a wipe and a power loss: a write torn at a chosen offset.

A house box's store (tests/house) is real LMDB on tmpfs. What a disk does to the write under way when the power
fails is modelled here, on the files of a box already powered off: `tear` leaves the log append
that was in flight torn, its bytes up to `offset` on the disk and zeros after (the sectors
never written), or lost whole (offset 0). That append never returned, so nothing of it was
acknowledged: on restart the store must discard it as an uncommitted tail (statemachine/txn.py,
torn_tail), and nothing committed may be lost.
"""

from __future__ import annotations

from pathlib import Path

import lmdb

from dpeer.consensus.entry import Entry
from dpeer.statemachine.entry import encode_entry, encode_key
from dpeer.statemachine.store import DEFAULT_MAP_SIZE


def torn_bytes(entry: Entry, offset: int) -> bytes:
    """The entry's stored value as a write cut at `offset` leaves it: zeros from there on."""
    value = encode_entry(entry)
    if not 0 <= offset <= len(value):
        raise ValueError(f"offset {offset} outside the entry's {len(value)} bytes")
    return value[:offset] + bytes(len(value) - offset)


def tear(store_dir: Path, entry: Entry, offset: int) -> None:
    """Leave `entry` at its index in the log of the (closed) store in store_dir, torn at `offset`
    bytes; offset 0 loses the write: nothing of it reached the disk (an entry held there stays)."""
    if offset == 0:
        return
    torn = torn_bytes(entry, offset)
    size = max(DEFAULT_MAP_SIZE, (store_dir / "data.mdb").stat().st_size)
    env = lmdb.open(str(store_dir), map_size=size, max_dbs=8, subdir=True)
    try:
        with env.begin(write=True) as txn:
            txn.put(encode_key(entry.index), torn, db=env.open_db(b"log", txn=txn, create=False))
    finally:
        env.close()
