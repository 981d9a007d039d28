"""Read-only accessors of a Store: the cached meta, log bounds and applied state.

Pure (no lmdb): the Store keeps these caches equal to what its last committed transaction wrote.
"""

from __future__ import annotations

from pathlib import Path

from dpeer.statemachine.meta import Meta
from dpeer.statemachine.state import ClusterState


class StoreProperties:
    """The Store's public read-only properties, served from memory without a transaction."""

    _path: Path
    _meta: Meta
    _last_index: int
    _last_term: int
    _state: ClusterState

    @property
    def path(self) -> Path:
        """The LMDB environment directory."""
        return self._path

    @property
    def node_id(self) -> str:
        """The node this store belongs to (fixed at creation)."""
        return self._meta.node_id

    @property
    def uid(self) -> str:
        """This store's identity: 32 hex digits drawn when it was created (a new disk, a new uid)."""
        return self._meta.uid

    @property
    def current_term(self) -> int:
        """The latest term this node has seen (durable)."""
        return self._meta.current_term

    @property
    def voted_for(self) -> str | None:
        """Whom this node voted for in current_term, if anyone (durable)."""
        return self._meta.voted_for

    @property
    def commit_index(self) -> int:
        """Highest log index known committed (durable, monotonic)."""
        return self._meta.commit_index

    @property
    def last_applied(self) -> int:
        """Highest index applied to `state` (durable, written with the state)."""
        return self._meta.last_applied

    @property
    def first_index(self) -> int:
        """First index still held in the log (snapshot_index + 1 when the log is empty)."""
        return self._meta.first_index

    @property
    def last_index(self) -> int:
        """Last index in the log, or the snapshot index when the log is empty."""
        return self._last_index

    @property
    def last_term(self) -> int:
        """Term of the entry at last_index."""
        return self._last_term

    @property
    def snapshot_index(self) -> int:
        """Log index the stored snapshot covers (0: none)."""
        return self._meta.snapshot_index

    @property
    def snapshot_term(self) -> int:
        """Term of the entry at snapshot_index."""
        return self._meta.snapshot_term

    @property
    def state(self) -> ClusterState:
        """The applied cluster state as of last_applied."""
        return self._state
