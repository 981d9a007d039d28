"""The Storage contract the Raft core reads and the caller writes, and an in-memory fake.

`Storage` mirrors dpeer.statemachine.store.Store (same property and method names and errors);
only snapshots differ: here a snapshot also carries the membership at its index, which a thin
adapter over Store decodes from the snapshot's cluster state. `MemoryStorage` ships with the
library for tests and the simulator and honours the same contract (tests/consensus/
test_storage_contract.py runs against any factory).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from dpeer.consensus.voting import VotingConfig
from dpeer.statemachine.entry import Entry, pack_payload
from dpeer.statemachine.errors import (
    Compacted,
    CommittedEntryError,
    HardStateError,
    LogGapError,
    StaleSnapshot,
)


@dataclass(frozen=True)
class Snapshot:
    """Applied state at log position (index, term): opaque bytes plus the membership there."""

    index: int
    term: int
    data: bytes
    membership: VotingConfig = field(default_factory=VotingConfig)


class Storage(Protocol):
    """Durable Raft state. Every mutator is durable when it returns; readers never block long.

    Log positions: first_index is the first entry held (entries below are compacted into the
    snapshot); last_index is 0 for an empty log; term_at(snapshot_index) is snapshot_term.
    uid is the storage's identity, drawn when it was created: new storage, new uid.
    """

    @property
    def uid(self) -> str: ...
    @property
    def current_term(self) -> int: ...
    @property
    def voted_for(self) -> str | None: ...
    @property
    def commit_index(self) -> int: ...
    @property
    def last_applied(self) -> int: ...
    @property
    def first_index(self) -> int: ...
    @property
    def last_index(self) -> int: ...
    @property
    def last_term(self) -> int: ...
    @property
    def snapshot_index(self) -> int: ...
    @property
    def snapshot_term(self) -> int: ...

    def set_hard_state(self, term: int, voted_for: str | None) -> None:
        """Persist term and vote; HardStateError if the term drops or a vote in a term changes."""

    def append(self, entries: Sequence[Entry]) -> None:
        """Persist contiguous entries, keeping matching ones and truncating from the first conflict;
        CommittedEntryError if that conflict is committed, LogGapError on a hole."""

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi) (hi clipped to last_index + 1), at least one when any, stopping past
        max_bytes; Compacted when lo < first_index."""

    def term_at(self, index: int) -> int | None:
        """Term at index (0 at index 0, snapshot_term at snapshot_index); None if not held."""

    def set_commit(self, index: int) -> None:
        """Persist a higher commit index (lower ones are ignored); ValueError past last_index."""

    def apply_to(self, index: int) -> list:
        """Apply committed entries up to min(index, commit_index) and persist last_applied."""

    def snapshot(self) -> Snapshot:
        """The latest snapshot (index 0 with empty data when none), to send to a lagging peer."""

    def install_snapshot(self, snap: Snapshot) -> None:
        """Replace state with snap: keep the log after snap.index if it matches there, else drop
        it; commit_index = last_applied = snap.index. StaleSnapshot if snap.index <= commit."""


def entry_size(entry: Entry) -> int:
    """Approximate encoded size of an entry, for max_bytes limits."""
    return 24 + len(entry.kind.value) + len(pack_payload(entry.payload))


class MemoryStorage:
    """A Storage in a Python list: the test and simulator fake, with Store's errors and rules."""

    def __init__(self, uid: str | None = None) -> None:
        self.uid = uid or secrets.token_hex(16)
        self.current_term = 0
        self.voted_for: str | None = None
        self.commit_index = 0
        self.last_applied = 0
        self._snap = Snapshot(0, 0, b"")
        self._log: list[Entry] = []  # entries after the snapshot (or a kept tail from first_index)

    @property
    def snapshot_index(self) -> int:
        """Index of the latest snapshot (0 when none)."""
        return self._snap.index

    @property
    def snapshot_term(self) -> int:
        """Term of the latest snapshot (0 when none)."""
        return self._snap.term

    @property
    def first_index(self) -> int:
        """First entry held; snapshot_index + 1 unless a tail was kept."""
        return self._log[0].index if self._log else self._snap.index + 1

    @property
    def last_index(self) -> int:
        """Last entry held, or the snapshot index when the log is empty."""
        return self._log[-1].index if self._log else self._snap.index

    @property
    def last_term(self) -> int:
        """Term of the last entry (or of the snapshot)."""
        return self._log[-1].term if self._log else self._snap.term

    def set_hard_state(self, term: int, voted_for: str | None) -> None:
        """Persist term and vote under Store's rules."""
        if term < self.current_term:
            raise HardStateError(f"term {term} is below current term {self.current_term}")
        if term == self.current_term and self.voted_for not in (None, voted_for):
            raise HardStateError(f"already voted for {self.voted_for!r} in term {term}")
        self.current_term, self.voted_for = term, voted_for

    def append(self, entries: Sequence[Entry]) -> None:
        """Append, skipping held entries and truncating from the first conflict."""
        new = [e for e in entries if not self._holds(e)]
        if not new:
            return
        _check_contiguous(new)
        start = new[0].index
        if start > self.last_index + 1:
            raise LogGapError(f"entry {start} would leave a gap after last index {self.last_index}")
        if start <= self.commit_index:
            raise CommittedEntryError(f"entry {start} conflicts with committed entries "
                                      f"(commit index {self.commit_index})")
        del self._log[start - self.first_index:]
        self._log.extend(new)

    def _holds(self, e: Entry) -> bool:
        if e.index < self.first_index:
            return True
        return e.index <= self.last_index and self.term_at(e.index) == e.term

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi) under the max_bytes rule."""
        if lo < self.first_index:
            raise Compacted(f"entries below {self.first_index} are compacted (asked from {lo})")
        out: list[Entry] = []
        size = 0
        for e in self._log[lo - self.first_index: max(0, hi - self.first_index)]:
            size += entry_size(e)
            if max_bytes is not None and out and size > max_bytes:
                break
            out.append(e)
        return out

    def term_at(self, index: int) -> int | None:
        """Term at index, or None when not held."""
        if index == self._snap.index:
            return self._snap.term
        if index < self.first_index or index > self.last_index:
            return None
        return self._log[index - self.first_index].term

    def set_commit(self, index: int) -> None:
        """Raise the commit index."""
        if index <= self.commit_index:
            return
        if index > self.last_index:
            raise ValueError(f"commit index {index} beyond last index {self.last_index}")
        self.commit_index = index

    def apply_to(self, index: int) -> list[Entry]:
        """Mark entries applied up to min(index, commit_index); returns them."""
        target = min(index, self.commit_index)
        if target <= self.last_applied:
            return []
        done = self.entries(self.last_applied + 1, target + 1)
        self.last_applied = target
        return done

    def snapshot(self) -> Snapshot:
        """The latest snapshot."""
        return self._snap

    def install_snapshot(self, snap: Snapshot) -> None:
        """Install a peer's snapshot."""
        if snap.index <= self.commit_index:
            raise StaleSnapshot(f"snapshot at {snap.index} is not beyond commit {self.commit_index}")
        keep = self.term_at(snap.index) == snap.term and snap.index < self.last_index
        self._log = [e for e in self._log if e.index > snap.index] if keep else []
        self._snap = snap
        self.commit_index = self.last_applied = snap.index

    def compact(self, index: int, data: bytes, membership: VotingConfig, keep_tail: int = 0) -> None:
        """Take a local snapshot at an applied index and drop entries before index - keep_tail + 1."""
        if not self._snap.index < index <= self.last_applied:
            raise ValueError(f"compact index {index} must be in ({self._snap.index}, "
                             f"{self.last_applied}]")
        term = self.term_at(index)
        assert term is not None
        new_first = max(self.first_index, index - keep_tail + 1)
        self._log = [e for e in self._log if e.index >= new_first]
        self._snap = Snapshot(index, term, data, membership)


def _check_contiguous(entries: Sequence[Entry]) -> None:
    for a, b in zip(entries, entries[1:]):
        if b.index != a.index + 1:
            raise LogGapError(f"entries are not contiguous: {a.index} then {b.index}")
