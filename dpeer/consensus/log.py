"""RaftLog: the core's view of the log, durable storage plus an unstable in-memory suffix.

Like etcd's raftLog: entries the core accepted but the caller has not persisted yet live in
`unstable` (starting at `offset`, which may lie below storage's last index when a conflict
is pending truncation); a snapshot received but not yet installed is `pending_snapshot`.
`committed` and `applied` are in memory; the caller persists them through Ready/advance.
"""

from __future__ import annotations

from typing import Sequence

from dpeer.consensus.entry import Entry, entry_size
from dpeer.consensus.storage import Snapshot, Storage


class LogInvariantError(AssertionError):
    """The core tried to break a Raft log invariant (a bug, never a peer's fault)."""


class RaftLog:
    """Storage plus unstable entries; all indices are Raft log indices."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.unstable: list[Entry] = []
        self.offset = storage.last_index + 1
        self.pending_snapshot: Snapshot | None = None
        self.committed = storage.commit_index
        self.applied = storage.last_applied

    # -- positions -------------------------------------------------------------------------
    def first_index(self) -> int:
        """First entry held (stable or pending)."""
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index + 1
        return self.storage.first_index

    def last_index(self) -> int:
        """Last entry (unstable first, then a pending snapshot, then storage)."""
        if self.unstable:
            return self.unstable[-1].index
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index
        return min(self.storage.last_index, self.offset - 1)

    def last_term(self) -> int:
        """Term of the last entry."""
        term = self.term(self.last_index())
        assert term is not None
        return term

    def stable_index(self) -> int:
        """Last index known durable (the leader counts only this toward its own match)."""
        return self.offset - 1 if self.pending_snapshot is None else 0

    def term(self, index: int) -> int | None:
        """Term at index, or None when compacted or beyond the last entry."""
        if index == 0:
            return 0
        snap = self.pending_snapshot
        if snap is not None and index <= snap.index:
            return snap.term if index == snap.index else None
        if index >= self.offset:
            off = index - self.offset
            return self.unstable[off].term if off < len(self.unstable) else None
        return self.storage.term_at(index)

    def match_term(self, index: int, term: int) -> bool:
        """True when the entry at index has this term."""
        return self.term(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft's election restriction: is (last_term, last_index) at least as new as ours?"""
        mine = self.last_term()
        return last_term > mine or (last_term == mine and last_index >= self.last_index())

    # -- reading ----------------------------------------------------------------------------
    def slice(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi) capped by bytes (at least one); Compacted below first_index."""
        out: list[Entry] = []
        if lo < self.offset:
            out = self.storage.entries(lo, min(hi, self.offset), max_bytes)
            if len(out) < min(hi, self.offset) - lo:
                return out
        budget = max_bytes - sum(entry_size(e) for e in out)
        for e in self.unstable[max(0, lo - self.offset): max(0, hi - self.offset)]:
            budget -= entry_size(e)
            if out and budget < 0:
                break
            out.append(e)
        return out

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The last position at or below index whose term is <= term (etcd's fast backoff)."""
        index = min(index, self.last_index())
        while index > 0:
            t = self.term(index)
            if t is None:
                return index, 0
            if t <= term:
                return index, t
            index -= 1
        return 0, 0

    def next_committed(self) -> list[Entry]:
        """Committed entries not yet applied, in order (none while a snapshot is pending)."""
        if self.pending_snapshot is not None or self.committed <= self.applied:
            return []
        return self.slice(self.applied + 1, self.committed + 1, 1 << 62)

    # -- writing ----------------------------------------------------------------------------
    def append(self, entries: Sequence[Entry]) -> None:
        """Add entries at their indices, dropping any unstable/stable suffix from the first one."""
        if not entries:
            return
        start = entries[0].index
        if start <= self.committed:
            raise LogInvariantError(f"append at {start} would overwrite committed {self.committed}")
        if start > self.last_index() + 1:
            raise LogInvariantError(f"append at {start} leaves a gap after {self.last_index()}")
        if start >= self.offset:
            del self.unstable[start - self.offset:]
        else:
            self.unstable, self.offset = [], start
        self.unstable.extend(entries)

    def find_conflict(self, entries: Sequence[Entry]) -> int:
        """Index of the first entry that is new or differs from ours; 0 when all are held."""
        for e in entries:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def commit_to(self, index: int) -> bool:
        """Raise the commit index (never beyond the last entry); True when it moved."""
        index = min(index, self.last_index())
        if index <= self.committed:
            return False
        self.committed = index
        return True

    def maybe_commit(self, index: int, term: int) -> bool:
        """Leader rule: commit index only if its entry is of the current term (Figure 8)."""
        return self.term(index) == term and self.commit_to(index)

    def restore(self, snap: Snapshot) -> None:
        """Replace the log by a snapshot (its installation is pending until stable)."""
        self.pending_snapshot = snap
        self.unstable, self.offset = [], snap.index + 1
        self.committed = snap.index

    # -- caller confirmations -----------------------------------------------------------------
    def stable_to(self, index: int, term: int) -> None:
        """The caller persisted entries up to (index, term)."""
        if index >= self.offset and self.match_term(index, term):
            del self.unstable[: index + 1 - self.offset]
            self.offset = index + 1

    def snapshot_installed(self, index: int) -> None:
        """The caller installed the pending snapshot at index."""
        if self.pending_snapshot is not None and self.pending_snapshot.index == index:
            self.pending_snapshot = None
            self.applied = max(self.applied, index)

    def applied_to(self, index: int) -> None:
        """The caller applied entries up to index."""
        if not self.applied <= index <= self.committed:
            raise LogInvariantError(f"applied {index} outside [{self.applied}, {self.committed}]")
        self.applied = index


def check_committed_batch(batch: list[Entry], commit_index: int, local_commit: int) -> str:
    """Why accept_committed must refuse the batch's shape, or '' when it may proceed."""
    for a, b in zip(batch, batch[1:]):
        if b.index != a.index + 1 or b.term < a.term:
            return "entries are not contiguous"
    if batch[-1].index > commit_index:
        return f"entry {batch[-1].index} is beyond the sender's commit index {commit_index}"
    if batch[0].index > max(local_commit, 1):
        return f"batch starts at {batch[0].index}; it must overlap our commit index {local_commit}"
    return ""
