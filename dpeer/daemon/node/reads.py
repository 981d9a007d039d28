"""The node's committed state, read-only: what the owners above the node (the worker link, the
service, the status, the leader's chores) read, so none of them reaches the store itself."""

from __future__ import annotations

from pathlib import Path

from dpeer.statemachine.entry import Entry
from dpeer.statemachine.state import ClusterState
from dpeer.statemachine.store import Store


class StateReads:
    """A read-only view of one node's store: the applied state and the log's positions."""

    def __init__(self, store: Store) -> None:
        self._store = store

    @property
    def state(self) -> ClusterState:
        """The applied cluster state (members, voters, view, checkpoint, job, kv)."""
        return self._store.state

    @property
    def uid(self) -> str:
        """This node's store uid (its identity beside its node id)."""
        return self._store.uid

    @property
    def current_term(self) -> int:
        """The Raft term this node last persisted."""
        return self._store.current_term

    @property
    def commit_index(self) -> int:
        """The highest index known committed."""
        return self._store.commit_index

    @property
    def last_applied(self) -> int:
        """The highest index applied to the state."""
        return self._store.last_applied

    @property
    def first_index(self) -> int:
        """The first index the log still holds (after compaction)."""
        return self._store.first_index

    @property
    def snapshot_index(self) -> int:
        """The index of the newest snapshot."""
        return self._store.snapshot_index

    @property
    def recovered_from(self) -> Path | None:
        """Where a corrupt store was moved aside at open, or None."""
        return self._store.recovered_from

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Committed entries [lo, hi), at most max_bytes of them (Compacted below first_index)."""
        return self._store.entries(lo, hi, max_bytes=max_bytes)
