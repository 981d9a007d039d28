"""The consensus core's Storage contract over the node's LMDB Store.

Only snapshots differ between the two: the core's snapshot also carries the voting
configuration at its index, which this adapter reads from the snapshot's cluster state.
"""

from __future__ import annotations

from typing import Sequence

from dpeer.consensus.voting import VotingConfig
from dpeer.consensus.storage import HardState, Snapshot
from dpeer.statemachine.entry import Entry
from dpeer.statemachine.snapshot import decode_snapshot
from dpeer.statemachine.store import Store


class StoreStorage:
    """Store seen through consensus.Storage and StorageWriter; every write is durable on return, as
    Store's are."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def uid(self) -> str:
        return self.store.uid

    @property
    def current_term(self) -> int:
        return self.store.current_term

    @property
    def voted_for(self) -> str | None:
        return self.store.voted_for

    @property
    def commit_index(self) -> int:
        return self.store.commit_index

    @property
    def last_applied(self) -> int:
        return self.store.last_applied

    @property
    def first_index(self) -> int:
        return self.store.first_index

    @property
    def last_index(self) -> int:
        return self.store.last_index

    @property
    def last_term(self) -> int:
        return self.store.last_term

    @property
    def snapshot_index(self) -> int:
        return self.store.snapshot_index

    @property
    def snapshot_term(self) -> int:
        return self.store.snapshot_term

    def save(self, hard_state: HardState | None, entries: Sequence[Entry]) -> None:
        """StorageWriter: hard state, entries and commit index in one synced transaction."""
        s = self.store
        term, vote, commit = ((hard_state.term, hard_state.voted_for, hard_state.commit) if hard_state
                              else (s.current_term, s.voted_for, s.commit_index))
        s.save(term, vote, entries, commit)

    def set_hard_state(self, term: int, voted_for: str | None) -> None:
        """Persist term and vote (fsynced before return)."""
        self.store.set_hard_state(term, voted_for)

    def append(self, entries: Sequence[Entry]) -> None:
        """Persist entries, truncating a conflicting uncommitted suffix."""
        self.store.append(entries)

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi); Compacted below first_index."""
        return self.store.entries(lo, hi, max_bytes)

    def term_at(self, index: int) -> int | None:
        """Term of the entry at index, or None when not held."""
        return self.store.term_at(index)

    def set_commit(self, index: int) -> None:
        """Persist a higher commit index."""
        self.store.set_commit(index)

    def apply_to(self, index: int) -> list:
        """Apply committed entries up to index with last_applied in the same transaction."""
        return self.store.apply_to(index)

    def snapshot(self) -> Snapshot:
        """The stored snapshot with the voting configuration at its index."""
        snap = self.store.snapshot()
        if snap.index == 0:
            return Snapshot(0, 0, snap.data)
        state = decode_snapshot(snap.index, snap.term, snap.data)
        conf = VotingConfig.of(state.voters, state.learners, state.uids, state.epoch, state.forced_at)
        return Snapshot(snap.index, snap.term, snap.data, conf)

    def install_snapshot(self, snap: Snapshot) -> None:
        """Install a leader's snapshot (validated by the store before anything changes)."""
        self.store.install_snapshot(snap.index, snap.term, snap.data)
