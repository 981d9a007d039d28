"""The snapshot of a Store: taking one and compacting the log below it, serving it, installing a peer's.

Each is one synced transaction of store.py's Disk; the caches of the log, the applied state and
the meta record change only after it committed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpeer.statemachine.applied import AppliedState
from dpeer.statemachine.durable_log import DurableLog
from dpeer.statemachine.errors import CorruptState, StaleSnapshot
from dpeer.statemachine.meta import Meta
from dpeer.statemachine.snapshot import StateSnapshot, decode_snapshot, encode_snapshot
from dpeer.statemachine.state import ClusterState, encode_state
from dpeer.statemachine.txn import SNAP_KEY, Txn, delete_range, put_meta

if TYPE_CHECKING:
    from dpeer.statemachine.store import Disk


class SnapshotStore:
    """The snapshot record and its fields of the shared meta record (snapshot_index,
    snapshot_term, first_index): what was compacted out of the log, and where the log starts."""

    def __init__(self, disk: Disk, meta: Meta, log: DurableLog, applied: AppliedState) -> None:
        self.disk, self.meta, self.log, self.applied = disk, meta, log, applied

    def maybe_take(self, every: int, keep_tail: int) -> bool:
        """Snapshot and compact once `every` entries were applied since the last snapshot."""
        if self.meta.last_applied - self.meta.snapshot_index < every:
            return False
        self.take(keep_tail)
        return True

    def take(self, keep_tail: int) -> StateSnapshot:
        """Durably snapshot the applied state and drop log entries below last_applied - keep_tail + 1,
        keeping a tail for slow peers."""
        self.disk.live()
        if keep_tail < 0:
            raise ValueError("keep_tail must be >= 0")
        snap = encode_snapshot(self.applied.state)
        if snap.index == 0:
            return snap
        new_first = max(self.meta.first_index, snap.index - keep_tail + 1)
        meta = {"snapshot_index": snap.index, "snapshot_term": snap.term, "first_index": new_first}

        def txn_fn(txn: Txn) -> None:
            txn.put(SNAP_KEY, snap.data, db=self.disk.dbs["snap"])
            delete_range(txn, self.disk.dbs["log"], None, new_first)
            put_meta(txn, self.disk.dbs, meta)

        self.disk.write(txn_fn)
        m = self.meta
        m.snapshot_index, m.snapshot_term, m.first_index = snap.index, snap.term, new_first
        return snap

    def stored(self) -> StateSnapshot:
        """The stored snapshot (what a peer behind first_index is sent); the empty state if none."""
        self.disk.live()
        if self.meta.snapshot_index == 0:
            return encode_snapshot(ClusterState())
        with self.disk.reading() as txn:
            data = txn.get(SNAP_KEY, db=self.disk.dbs["snap"])
        if data is None:
            raise CorruptState("the snapshot named by meta is missing")
        return StateSnapshot(self.meta.snapshot_index, self.meta.snapshot_term, bytes(data))

    def install(self, index: int, term: int, data: bytes) -> None:
        """Replace the state with a peer's snapshot (validated first); keep the log after index if
        it matches at (index, term), else discard the whole log."""
        self.disk.live()
        state = decode_snapshot(index, term, data)
        if index <= self.meta.commit_index:
            raise StaleSnapshot(f"snapshot at {index} is not beyond commit index "
                                f"{self.meta.commit_index}")
        keep = self.log.term_at(index) == term and index < self.log.last_index
        meta = {"snapshot_index": index, "snapshot_term": term, "first_index": index + 1,
                "commit_index": index, "last_applied": index}

        def txn_fn(txn: Txn) -> None:
            if keep:
                delete_range(txn, self.disk.dbs["log"], None, index + 1)
            else:
                txn.drop(self.disk.dbs["log"], delete=False)
            txn.put(SNAP_KEY, bytes(data), db=self.disk.dbs["snap"])
            self.applied.put_state(txn, encode_state(state), meta)

        self.disk.write(txn_fn)
        for name, value in meta.items():
            setattr(self.meta, name, value)
        self.applied.state = state
        if not keep:
            self.log.last_index, self.log.last_term = index, term
