"""The Storage contract the Raft core reads, the writer its one persist path writes through, and an
in-memory fake of both.

`Storage` is read-only, as etcd's is: hard state, entries, terms, log bounds, snapshot. Writes go
through `StorageWriter`, which only ready.persist calls, for the daemon's node and the simulations
alike. dpeer.statemachine.store.Store honours both (same names and errors) behind a thin adapter
(daemon/storage_adapter.py) that also decodes the voting configuration a snapshot carries.
`MemoryStorage` ships with the library for tests and the simulator and honours the same contract
(tests/consensus/test_storage_contract.py runs against any factory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol, Sequence

from dpeer.consensus.entry import Entry, RaftKind, entry_size
from dpeer.consensus.errors import (
    Compacted,
    CommittedEntryError,
    HardStateError,
    LogGapError,
    StaleSnapshot,
)
from dpeer.consensus.voting import ConfigChangeError, VotingConfig
from dpeer.ids import SECRETS, Ids, new_uid


@dataclass(frozen=True)
class Snapshot:
    """Applied state at log position (index, term): opaque bytes plus the membership there."""

    index: int
    term: int
    data: bytes
    membership: VotingConfig = field(default_factory=VotingConfig)


@dataclass(frozen=True)
class HardState:
    """Durable Raft state: the term, the vote given in it, and the commit index."""

    term: int
    voted_for: str | None
    commit: int


class Storage(Protocol):
    """Durable Raft state as the core reads it; read-only (StorageWriter writes). Each field says
    when it is durable: the core relies on exactly that after a crash.

    Log positions: first_index is the first entry held (entries below are compacted into the
    snapshot); last_index is 0 for an empty log; term_at(snapshot_index) is snapshot_term.
    """

    @property
    def uid(self) -> str:
        """The storage's identity, drawn once when it was created (new storage, new uid); durable
        from creation, never changed."""

    @property
    def current_term(self) -> int:
        """The latest term seen; durable before any message of that term leaves (a vote or an
        acknowledgement sent in a term the disk forgot could be given twice)."""

    @property
    def voted_for(self) -> str | None:
        """The vote given in current_term (None: none yet); durable, with current_term, before the
        vote is sent, and never changed within a term."""

    @property
    def commit_index(self) -> int:
        """The highest index known committed; durable with the Ready that raised it, never lowered.
        Raft needs it only as a hint: a node back with an older one learns the newer from the leader."""

    @property
    def last_applied(self) -> int:
        """The highest entry the application applied; written by the application in the same
        transaction as its applied state (never by the core), so no entry is applied twice."""

    @property
    def first_index(self) -> int:
        """The first entry held; moves up with a snapshot (local or installed), durable with it."""

    @property
    def last_index(self) -> int:
        """The last entry held; entries up to it are durable before the messages of their Ready
        leave (an acknowledged entry survives a crash). An uncommitted tail may be truncated by a
        leader's conflicting entries, or lost to a torn write; a committed entry never."""

    @property
    def last_term(self) -> int:
        """The term of the entry at last_index (or of the snapshot when the log is empty)."""

    @property
    def snapshot_index(self) -> int:
        """The index the latest snapshot covers (0 when none); durable with the snapshot."""

    @property
    def snapshot_term(self) -> int:
        """The term of the entry at snapshot_index; durable with the snapshot."""

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi) (hi clipped to last_index + 1), at least one when any, stopping past
        max_bytes; Compacted when lo < first_index."""

    def term_at(self, index: int) -> int | None:
        """Term at index (0 at index 0, snapshot_term at snapshot_index); None if not held."""

    def snapshot(self) -> Snapshot:
        """The latest snapshot (index 0 with empty data when none), to send to a lagging peer."""


class StorageWriter(Protocol):
    """The writes a Ready makes durable, called by ready.persist alone (the one persist path):
    each is durable when it returns, and on an error writes nothing."""

    def install_snapshot(self, snap: Snapshot) -> None:
        """Replace state with snap: keep the log after snap.index if it matches there, else drop
        it; commit_index = last_applied = snap.index. StaleSnapshot if snap.index <= commit."""

    def save(self, hard_state: HardState | None, entries: Sequence[Entry]) -> None:
        """In one durable write: the hard state (None: term, vote and commit stay), then entries
        appended (matching ones kept, the log truncated from the first conflict), then the commit
        index raised to hard_state.commit. HardStateError if the term drops or a vote in a term
        changes, CommittedEntryError if a conflict is committed, LogGapError on a hole,
        ValueError for a commit index past the last entry."""


class WritableStorage(Storage, StorageWriter, Protocol):
    """A storage and its writer in one object, as MemoryStorage and the daemon's adapter are."""


def bootstrap(storage: WritableStorage, voters: Iterable[str], learners: Iterable[str] = (), *,
              uids: Mapping[str, str]) -> None:
    """Found a cluster on an empty storage: a committed config_change entry at index 1, term 1,
    epoch 1, naming each founding member with its store uid.

    Every founding member runs this with the same sets, so their logs start identical (etcd does
    the same); nodes that join later start empty and learn the configuration from the leader.
    """
    if storage.last_index != 0 or storage.snapshot_index != 0:
        raise ConfigChangeError("bootstrap needs an empty storage")
    conf = VotingConfig.of(voters, learners, uids)
    if not conf.voters:
        raise ConfigChangeError("bootstrap needs at least one voter")
    storage.save(HardState(1, None, 1), [Entry(1, 1, RaftKind.CONFIG_CHANGE, conf.to_payload())])


class MemoryStorage:
    """A Storage and StorageWriter in a Python list: the test and simulator fake, with Store's
    errors and rules. Its single-step writes (set_hard_state, append, set_commit) and apply_to
    stand for the daemon store's own, for the tests and the simulator's application."""

    def __init__(self, uid: str | None = None, ids: Ids = SECRETS) -> None:
        self.uid = uid or new_uid(ids)
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

    def save(self, hard_state: HardState | None, entries: Sequence[Entry]) -> None:
        """StorageWriter: hard state, entries and commit index, all or nothing."""
        saved = (self.current_term, self.voted_for, self.commit_index, list(self._log))
        try:
            if hard_state is not None:
                self.set_hard_state(hard_state.term, hard_state.voted_for)
            self.append(entries)
            if hard_state is not None:
                self.set_commit(hard_state.commit)
        except BaseException:
            self.current_term, self.voted_for, self.commit_index, self._log = saved
            raise

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
