"""The applied cluster state of a Store and last_applied, written in one transaction.

The state record and last_applied move together in one synced transaction of store.py's Disk, so
a crash never applies an entry twice; the cached state changes only after that commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpeer.statemachine.durable_log import DurableLog
from dpeer.statemachine.entry import Entry
from dpeer.statemachine.meta import Meta
from dpeer.statemachine.state import ApplyResult, ClusterState, apply_many, encode_state
from dpeer.statemachine.txn import STATE_KEY, Txn, put_meta

if TYPE_CHECKING:
    from dpeer.statemachine.store import Disk

APPLY_BATCH = 10_000  # entries applied per transaction by apply_to


class AppliedState:
    """The cluster state as of last_applied (its field of the shared meta record), applied from
    the committed log; install_snapshot replaces both with a peer's snapshot."""

    def __init__(self, disk: Disk, meta: Meta, log: DurableLog, state: ClusterState) -> None:
        self.disk, self.meta, self.log = disk, meta, log
        self.state = state

    def apply_to(self, index: int) -> list[tuple[Entry, ApplyResult]]:
        """Apply committed entries up to min(index, commit_index); state and last_applied are
        written in the same transaction, so a crash never applies an entry twice."""
        self.disk.live()
        target = min(index, self.meta.commit_index)
        done: list[tuple[Entry, ApplyResult]] = []
        while self.meta.last_applied < target:
            hi = min(target, self.meta.last_applied + APPLY_BATCH)
            batch = self.log.entries(self.meta.last_applied + 1, hi + 1)
            state, results = apply_many(self.state, batch)
            blob = encode_state(state)
            self.disk.write(lambda txn: self.put_state(txn, blob, {"last_applied": hi}))
            self.state, self.meta.last_applied = state, hi
            done.extend(zip(batch, results))
        return done

    def put_state(self, txn: Txn, blob: bytes, meta: dict[str, Any]) -> None:
        """Write the encoded state and the meta fields that go with it in txn."""
        txn.put(STATE_KEY, blob, db=self.disk.dbs["state"])
        put_meta(txn, self.disk.dbs, meta)
