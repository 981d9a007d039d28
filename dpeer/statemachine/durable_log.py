"""The Raft log and hard state of a Store: term, vote, commit index and the entries.

Every write is one synced transaction of store.py's Disk (the only holder of lmdb handles), and the
caches here change only after it committed. Log positions and errors are consensus's Storage
contract (consensus/storage.py), which the daemon's adapter serves from these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from dpeer.statemachine.entry import (
    Entry,
    check_contiguous,
    decode_entry,
    decode_key,
    encode_entry,
    encode_key,
)
from dpeer.statemachine.errors import (
    CommittedEntryError,
    Compacted,
    CorruptEntry,
    HardStateError,
    LogGapError,
    StoreError,
)
from dpeer.statemachine.meta import Meta
from dpeer.statemachine.txn import Txn, delete_range, put_meta

if TYPE_CHECKING:
    from dpeer.statemachine.store import Disk


class DurableLog:
    """The log's entries and bounds (last_index, last_term) and the hard state it keeps in the
    shared meta record (current_term, voted_for, commit_index). first_index and the snapshot
    position are the snapshots' fields of that record, read here; install_snapshot moves the
    bounds when it discards the log."""

    def __init__(self, disk: Disk, meta: Meta, bounds: tuple[int, int]) -> None:
        self.disk, self.meta = disk, meta
        self.last_index, self.last_term = bounds

    def set_hard_state(self, term: int, voted_for: str | None) -> None:
        """Durably record term and vote before returning (a vote must be on disk before it is sent)."""
        self.disk.live()
        m = self.meta
        if term < m.current_term:
            raise HardStateError(f"term {term} is below current term {m.current_term}")
        if term == m.current_term and m.voted_for not in (None, voted_for):
            raise HardStateError(f"already voted for {m.voted_for!r} in term {term}")
        self.disk.write(lambda txn: put_meta(txn, self.disk.dbs,
                                             {"current_term": term, "voted_for": voted_for}))
        m.current_term, m.voted_for = term, voted_for

    def save(self, term: int, voted_for: str | None, entries: Sequence[Entry], commit: int) -> None:
        """What a Raft Ready persists, in ONE synced transaction: hard state, new entries, commit.

        The same checks as set_hard_state, append and set_commit apply; on any error nothing is
        written and the cached hard state and bounds are as before. One fsync instead of three per
        replicated batch.
        """
        self.disk.live()
        m = self.meta
        saved = (m.current_term, m.voted_for, m.commit_index, self.last_index, self.last_term)

        def steps() -> None:
            if (term, voted_for) != (m.current_term, m.voted_for):
                self.set_hard_state(term, voted_for)
            if entries:
                self.append(entries)
            self.set_commit(commit)

        def undo() -> None:
            m.current_term, m.voted_for, m.commit_index, self.last_index, self.last_term = saved

        self.disk.batch(steps, undo)

    def append(self, entries: Sequence[Entry]) -> None:
        """Durably append contiguous entries. Entries already held with the same term are kept;
        the log is truncated from the first entry whose term differs (never a committed one)."""
        self.disk.live()
        new = self._skip_matching(check_contiguous(entries))
        if not new:
            return
        start = new[0].index
        if start > self.last_index + 1:
            raise LogGapError(f"entry {start} would leave a gap after last index {self.last_index}")
        if start <= self.meta.commit_index:
            raise CommittedEntryError(f"entry {start} conflicts with committed entry "
                                      f"(commit index {self.meta.commit_index})")
        prev = self.term_at(start - 1)
        if prev is not None and new[0].term < prev:
            raise LogGapError(f"entry {start} has term {new[0].term} below previous term {prev}")
        items = [(encode_key(e.index), encode_entry(e)) for e in new]
        truncate = start <= self.last_index
        self.disk.write(lambda txn: self._append_txn(txn, items, start if truncate else None))
        self.last_index, self.last_term = new[-1].index, new[-1].term

    def _append_txn(self, txn: Txn, items: list[tuple[bytes, bytes]], truncate_from: int | None) -> None:
        if truncate_from is not None:
            delete_range(txn, self.disk.dbs["log"], truncate_from, None)
        _, added = txn.cursor(db=self.disk.dbs["log"]).putmulti(items, append=True)
        if added != len(items):
            # py-lmdb reports an out-of-order append=True put only through this count.
            raise StoreError(f"log append wrote {added} of {len(items)} entries: keys out of order "
                             f"(cached last index {self.last_index} disagrees with the log)")

    def _skip_matching(self, entries: list[Entry]) -> list[Entry]:
        """Drop the leading entries already held (same index and term) or compacted below the snapshot."""
        skip = 0
        for e in entries:
            if e.index < self.meta.first_index and e.index != self.meta.snapshot_index:
                skip += 1  # compacted, hence committed: Raft guarantees it matches
                continue
            if e.index > self.last_index or self.term_at(e.index) != e.term:
                break
            skip += 1
        return entries[skip:]

    def truncate_suffix(self, from_index: int) -> None:
        """Durably remove entries from from_index to the end; committed entries are never removed."""
        self.disk.live()
        if from_index > self.last_index:
            return
        if from_index <= self.meta.commit_index:
            raise CommittedEntryError(f"cannot truncate from {from_index}: entries up to "
                                      f"{self.meta.commit_index} are committed")
        prev_term = self.term_at(from_index - 1) or 0
        self.disk.write(lambda txn: delete_range(txn, self.disk.dbs["log"], from_index, None))
        self.last_index, self.last_term = from_index - 1, prev_term

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi) as a resync serves them, stopping past max_bytes (at least one entry);
        raises Compacted when lo is below first_index."""
        self.disk.live()
        if lo < self.meta.first_index:
            raise Compacted(f"entries below {self.meta.first_index} are compacted (asked from {lo}); "
                            f"send the snapshot at {self.meta.snapshot_index}")
        hi = min(hi, self.last_index + 1)
        out: list[Entry] = []
        if lo >= hi:
            return out
        size, key = 0, b""
        with self.disk.reading() as txn:
            cur = txn.cursor(db=self.disk.dbs["log"])
            if not cur.set_key(encode_key(lo)):
                raise CorruptEntry(f"entry {lo} is missing from the log")
            for i, (k, v) in enumerate(cur.iternext(), lo):
                if i >= hi:
                    break
                size += len(v)
                if max_bytes is not None and out and size > max_bytes:
                    break
                out.append(decode_entry(i, v))
                key = k
        # Keys are distinct and increasing, so the last one sitting at its place means no holes.
        if decode_key(key) != lo + len(out) - 1:
            raise CorruptEntry(f"log has a hole in {lo}..{decode_key(key)}")
        return out

    def term_at(self, index: int) -> int | None:
        """Term of the entry at index (the snapshot's term at snapshot_index); None if not held."""
        m = self.meta
        if index == m.snapshot_index:
            return m.snapshot_term
        if index == 0:
            return 0
        if index < m.first_index or index > self.last_index:
            return None
        if index == self.last_index:
            return self.last_term
        self.disk.live()
        with self.disk.reading() as txn:
            value = txn.get(encode_key(index), db=self.disk.dbs["log"])
        if value is None:
            raise CorruptEntry(f"entry {index} is missing from the log")
        return decode_entry(index, value).term

    def set_commit(self, index: int) -> None:
        """Durably raise the commit index (lower values are ignored; it never goes back)."""
        self.disk.live()
        if index <= self.meta.commit_index:
            return
        if index > self.last_index:
            raise ValueError(f"commit index {index} beyond last index {self.last_index}")
        self.disk.write(lambda txn: put_meta(txn, self.disk.dbs, {"commit_index": index}))
        self.meta.commit_index = index
