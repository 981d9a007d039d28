"""The node's durable state: one LMDB environment holding meta, the log, the applied state and a
snapshot. The only module in dpeer that imports lmdb.

Open it in the daemon only, after any fork: LMDB handles must never cross a fork, and a Store
raises StoreForkedError if it is used from a process other than the one that opened it. Every
write is synced (sync=True, metasync=True) before the call returns. Give the Store a directory of
its own: a store that fails its checks is renamed aside as a whole, never deleted.
"""

from __future__ import annotations

import logging
import os
import resource
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterator, Sequence, TypeVar

import lmdb

from dpeer.ids import SECRETS, Ids, new_uid
from dpeer.statemachine.aside import move_aside
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
    CorruptState,
    HardStateError,
    LogGapError,
    NodeIdMismatch,
    StaleSnapshot,
    StoreClosed,
    StoreError,
    StoreForkedError,
)
from dpeer.statemachine.meta import (
    BadMeta,
    Meta,
    check_version,
    decode_raw,
    parse_meta,
    salvage,
)
from dpeer.statemachine.props import StoreProperties
from dpeer.statemachine.snapshot import StateSnapshot, decode_snapshot, encode_snapshot
from dpeer.statemachine.state import (
    ApplyResult,
    ClusterState,
    apply_many,
    encode_state,
)
from dpeer.statemachine.txn import (
    SNAP_KEY,
    STATE_KEY,
    check_contents,
    delete_range,
    put_meta,
    torn_tail,
)

log = logging.getLogger("dpeer.statemachine")

DEFAULT_MAP_SIZE = 64 << 20
APPLY_BATCH = 10_000  # entries applied per transaction by apply_to
_T = TypeVar("_T")


class _Unusable(Exception):
    """Internal: the store on disk failed a check; carries what could be salvaged from it."""

    def __init__(self, reason: str, fields: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.fields = fields or {}


class Store(StoreProperties):
    """Durable Raft storage plus the applied cluster state for one node; one owner, one thread."""

    def __init__(self, env: lmdb.Environment, dbs: dict[str, Any], path: Path, meta: Meta,
                 bounds: tuple[int, int], state: ClusterState, map_size: int) -> None:
        self._env, self._dbs, self._path, self._meta = env, dbs, path, meta
        self._last_index, self._last_term = bounds
        self._state, self._map_size = state, map_size
        self._pid = os.getpid()
        self._closed = False
        self._txn: lmdb.Transaction | None = None
        self.recovered_from: Path | None = None

    @classmethod
    def open(cls, path: str | Path, *, node_id: str | None = None,
             map_size: int = DEFAULT_MAP_SIZE, ids: Ids = SECRETS) -> Store:
        """Open (or create) the store at the directory `path`; a store that fails its checks is
        renamed to `<path>.corrupt-<timestamp>` and an empty one created in its place. ids: where
        a new store draws its uid."""
        path = Path(path)
        try:
            return cls._open_checked(path, node_id, map_size, {}, ids)
        except _Unusable as bad:
            aside = move_aside(path)
            nid, term, vote = salvage(bad.fields)
            log.error("state store %s failed its checks (%s); moved aside to %s, starting empty "
                      "and resyncing from peers (kept term %d, vote %s)", path, bad, aside, term, vote)
            if node_id is None and nid is None:
                raise StoreError(f"store {path} was unusable ({bad}) and moved aside to {aside}; "
                                 "pass node_id to create a fresh one") from bad
            salvaged = {"node_id": node_id or nid, "current_term": term, "voted_for": vote}
            store = cls._open_checked(path, node_id or nid, map_size, salvaged, ids)
            store.recovered_from = aside
            return store

    @classmethod
    def _open_checked(cls, path: Path, node_id: str | None, map_size: int,
                      salvaged: dict[str, Any], ids: Ids) -> Store:
        path.mkdir(parents=True, exist_ok=True)
        data = path / "data.mdb"
        size = data.stat().st_size if data.exists() else None
        if size is not None and size < 2 * resource.getpagesize():
            raise _Unusable(f"data.mdb is torn ({size} bytes, shorter than its two meta pages)")
        try:
            env = lmdb.open(str(path), map_size=max(map_size, size or 0), max_dbs=8, subdir=True,
                            sync=True, metasync=True, readahead=False, meminit=False, lock=True)
        except lmdb.Error as exc:
            raise _Unusable(f"LMDB refused to open it: {exc}") from exc
        try:
            return cls._check_env(env, path, node_id, salvaged, ids)
        except lmdb.Error as exc:
            env.close()
            raise _Unusable(f"LMDB error while checking it: {exc}") from exc
        except BaseException:
            env.close()
            raise

    @classmethod
    def _check_env(cls, env: lmdb.Environment, path: Path, node_id: str | None,
                   salvaged: dict[str, Any], ids: Ids) -> Store:
        size = (path / "data.mdb").stat().st_size
        need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        if size < need:
            raise _Unusable(f"data.mdb is torn ({size} bytes, its meta page says {need})")
        env.reader_check()
        fields = _read_meta_fields(env)
        if fields is None:
            return cls._create(env, path, node_id, salvaged, ids)
        check_version(fields)
        try:
            meta = parse_meta(fields)
        except BadMeta as exc:
            raise _Unusable(str(exc), fields) from exc
        if node_id is not None and node_id != meta.node_id:
            raise NodeIdMismatch(f"store {path} belongs to node {meta.node_id!r}, not {node_id!r}")
        dbs = _open_dbs(env)
        try:
            bounds, state = _check_dropping_torn_tail(env, dbs, meta, path)
        except (CorruptEntry, CorruptState, BadMeta) as exc:
            raise _Unusable(str(exc), fields) from exc
        return cls(env, dbs, path, meta, bounds, state, env.info()["map_size"])

    @classmethod
    def _create(cls, env: lmdb.Environment, path: Path, node_id: str | None,
                salvaged: dict[str, Any], ids: Ids) -> Store:
        if env.stat()["entries"]:
            raise _Unusable("the environment holds data but no meta record")
        if not node_id:
            raise StoreError(f"no store at {path}; a node_id is needed to create one")
        # A new store is a new identity, a salvaged one too: it lost the log its votes stood for.
        meta = Meta(node_id, new_uid(ids), salvaged.get("current_term", 0), salvaged.get("voted_for"))
        state = ClusterState()
        dbs = _open_dbs(env)
        with env.begin(write=True) as txn:
            put_meta(txn, dbs, meta.fields())
            txn.put(STATE_KEY, encode_state(state), db=dbs["state"])
        log.info("created state store %s for node %s (store identity %s)", path, node_id, meta.uid)
        return cls(env, dbs, path, meta, (0, 0), state, env.info()["map_size"])

    def set_hard_state(self, term: int, voted_for: str | None) -> None:
        """Durably record term and vote before returning (a vote must be on disk before it is sent)."""
        m = self._live()._meta
        if term < m.current_term:
            raise HardStateError(f"term {term} is below current term {m.current_term}")
        if term == m.current_term and m.voted_for not in (None, voted_for):
            raise HardStateError(f"already voted for {m.voted_for!r} in term {term}")
        self._write(lambda txn: put_meta(txn, self._dbs,
                                          {"current_term": term, "voted_for": voted_for}))
        m.current_term, m.voted_for = term, voted_for

    def save(self, term: int, voted_for: str | None, entries: Sequence[Entry], commit: int) -> None:
        """What a Raft Ready persists, in ONE synced transaction: hard state, new entries, commit.

        The same checks as set_hard_state, append and set_commit apply; on any error nothing is
        written and the cached meta is as before. One fsync instead of three per replicated batch.
        """
        self._live()
        while True:
            saved = (replace(self._meta), self._last_index, self._last_term)
            self._txn = self._env.begin(write=True)
            try:
                if (term, voted_for) != (self._meta.current_term, self._meta.voted_for):
                    self.set_hard_state(term, voted_for)
                if entries:
                    self.append(entries)
                self.set_commit(commit)
                self._txn.commit()
                return
            except BaseException as exc:
                self._txn.abort()
                self._meta, self._last_index, self._last_term = saved
                if not isinstance(exc, lmdb.MapFullError):
                    raise
                self._grow()
            finally:
                self._txn = None

    def append(self, entries: Sequence[Entry]) -> None:
        """Durably append contiguous entries. Entries already held with the same term are kept;
        the log is truncated from the first entry whose term differs (never a committed one)."""
        self._live()
        new = self._skip_matching(check_contiguous(entries))
        if not new:
            return
        start = new[0].index
        if start > self._last_index + 1:
            raise LogGapError(f"entry {start} would leave a gap after last index {self._last_index}")
        if start <= self._meta.commit_index:
            raise CommittedEntryError(f"entry {start} conflicts with committed entry "
                                      f"(commit index {self._meta.commit_index})")
        prev = self.term_at(start - 1)
        if prev is not None and new[0].term < prev:
            raise LogGapError(f"entry {start} has term {new[0].term} below previous term {prev}")
        items = [(encode_key(e.index), encode_entry(e)) for e in new]
        truncate = start <= self._last_index
        self._write(lambda txn: self._append_txn(txn, items, start if truncate else None))
        self._last_index, self._last_term = new[-1].index, new[-1].term

    def _append_txn(self, txn: lmdb.Transaction, items: list[tuple[bytes, bytes]],
                    truncate_from: int | None) -> None:
        if truncate_from is not None:
            delete_range(txn, self._dbs["log"], truncate_from, None)
        _, added = txn.cursor(db=self._dbs["log"]).putmulti(items, append=True)
        if added != len(items):
            # py-lmdb reports an out-of-order append=True put only through this count.
            raise StoreError(f"log append wrote {added} of {len(items)} entries: keys out of order "
                             f"(cached last index {self._last_index} disagrees with the log)")

    def _skip_matching(self, entries: list[Entry]) -> list[Entry]:
        """Drop the leading entries already held (same index and term) or compacted below the snapshot."""
        skip = 0
        for e in entries:
            if e.index < self._meta.first_index and e.index != self._meta.snapshot_index:
                skip += 1  # compacted, hence committed: Raft guarantees it matches
                continue
            if e.index > self._last_index or self.term_at(e.index) != e.term:
                break
            skip += 1
        return entries[skip:]

    def truncate_suffix(self, from_index: int) -> None:
        """Durably remove entries from from_index to the end; committed entries are never removed."""
        self._live()
        if from_index > self._last_index:
            return
        if from_index <= self._meta.commit_index:
            raise CommittedEntryError(f"cannot truncate from {from_index}: entries up to "
                                      f"{self._meta.commit_index} are committed")
        prev_term = self.term_at(from_index - 1) or 0
        self._write(lambda txn: delete_range(txn, self._dbs["log"], from_index, None))
        self._last_index, self._last_term = from_index - 1, prev_term

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi) as a resync serves them, stopping past max_bytes (at least one entry);
        raises Compacted when lo is below first_index."""
        self._live()
        if lo < self._meta.first_index:
            raise Compacted(f"entries below {self._meta.first_index} are compacted (asked from {lo}); "
                            f"send the snapshot at {self._meta.snapshot_index}")
        hi = min(hi, self._last_index + 1)
        out: list[Entry] = []
        if lo >= hi:
            return out
        size, key = 0, b""
        with self._reading() as txn:
            cur = txn.cursor(db=self._dbs["log"])
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
        m = self._meta
        if index == m.snapshot_index:
            return m.snapshot_term
        if index == 0:
            return 0
        if index < m.first_index or index > self._last_index:
            return None
        if index == self._last_index:
            return self._last_term
        with self._live()._reading() as txn:
            value = txn.get(encode_key(index), db=self._dbs["log"])
        if value is None:
            raise CorruptEntry(f"entry {index} is missing from the log")
        return decode_entry(index, value).term

    def set_commit(self, index: int) -> None:
        """Durably raise the commit index (lower values are ignored; it never goes back)."""
        self._live()
        if index <= self._meta.commit_index:
            return
        if index > self._last_index:
            raise ValueError(f"commit index {index} beyond last index {self._last_index}")
        self._write(lambda txn: put_meta(txn, self._dbs, {"commit_index": index}))
        self._meta.commit_index = index

    def apply_to(self, index: int) -> list[tuple[Entry, ApplyResult]]:
        """Apply committed entries up to min(index, commit_index); state and last_applied are
        written in the same transaction, so a crash never applies an entry twice."""
        self._live()
        target = min(index, self._meta.commit_index)
        done: list[tuple[Entry, ApplyResult]] = []
        while self._meta.last_applied < target:
            hi = min(target, self._meta.last_applied + APPLY_BATCH)
            batch = self.entries(self._meta.last_applied + 1, hi + 1)
            state, results = apply_many(self._state, batch)
            blob = encode_state(state)
            self._write(lambda txn: self._put_state(txn, blob, {"last_applied": hi}))
            self._state, self._meta.last_applied = state, hi
            done.extend(zip(batch, results))
        return done

    def _put_state(self, txn: lmdb.Transaction, blob: bytes, meta: dict[str, Any]) -> None:
        txn.put(STATE_KEY, blob, db=self._dbs["state"])
        put_meta(txn, self._dbs, meta)

    def maybe_snapshot(self, every: int = 10_000, keep_tail: int = 1_000) -> bool:
        """Snapshot and compact once `every` entries were applied since the last snapshot."""
        if self._meta.last_applied - self._meta.snapshot_index < every:
            return False
        self.snapshot_now(keep_tail)
        return True

    def snapshot_now(self, keep_tail: int = 1_000) -> StateSnapshot:
        """Durably snapshot the applied state and drop log entries below last_applied - keep_tail + 1,
        keeping a tail for slow peers."""
        self._live()
        if keep_tail < 0:
            raise ValueError("keep_tail must be >= 0")
        snap = encode_snapshot(self._state)
        if snap.index == 0:
            return snap
        new_first = max(self._meta.first_index, snap.index - keep_tail + 1)
        meta = {"snapshot_index": snap.index, "snapshot_term": snap.term, "first_index": new_first}

        def txn_fn(txn: lmdb.Transaction) -> None:
            txn.put(SNAP_KEY, snap.data, db=self._dbs["snap"])
            delete_range(txn, self._dbs["log"], None, new_first)
            put_meta(txn, self._dbs, meta)

        self._write(txn_fn)
        m = self._meta
        m.snapshot_index, m.snapshot_term, m.first_index = snap.index, snap.term, new_first
        return snap

    def snapshot(self) -> StateSnapshot:
        """The stored snapshot (what a peer behind first_index is sent); the empty state if none."""
        self._live()
        if self._meta.snapshot_index == 0:
            return encode_snapshot(ClusterState())
        with self._env.begin() as txn:
            data = txn.get(SNAP_KEY, db=self._dbs["snap"])
        if data is None:
            raise CorruptState("the snapshot named by meta is missing")
        return StateSnapshot(self._meta.snapshot_index, self._meta.snapshot_term, bytes(data))

    def install_snapshot(self, index: int, term: int, data: bytes) -> None:
        """Replace the state with a peer's snapshot (validated first); keep the log after index if
        it matches at (index, term), else discard the whole log."""
        self._live()
        state = decode_snapshot(index, term, data)
        if index <= self._meta.commit_index:
            raise StaleSnapshot(f"snapshot at {index} is not beyond commit index "
                                f"{self._meta.commit_index}")
        keep = self.term_at(index) == term and index < self._last_index
        meta = {"snapshot_index": index, "snapshot_term": term, "first_index": index + 1,
                "commit_index": index, "last_applied": index}

        def txn_fn(txn: lmdb.Transaction) -> None:
            if keep:
                delete_range(txn, self._dbs["log"], None, index + 1)
            else:
                txn.drop(self._dbs["log"], delete=False)
            txn.put(SNAP_KEY, bytes(data), db=self._dbs["snap"])
            self._put_state(txn, encode_state(state), meta)

        self._write(txn_fn)
        for name, value in meta.items():
            setattr(self._meta, name, value)
        self._state = state
        if not keep:
            self._last_index, self._last_term = index, term

    def close(self) -> None:
        """Close the environment; later calls raise StoreClosed."""
        if not self._closed and self._pid == os.getpid():
            self._env.close()
        self._closed = True

    def __enter__(self) -> Store:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _live(self) -> Store:
        """Refuse use after close or from a forked child."""
        if self._closed:
            raise StoreClosed(f"store {self._path} is closed")
        if os.getpid() != self._pid:
            raise StoreForkedError(f"store {self._path} was opened in process {self._pid}; "
                                   "open a new Store after fork instead")
        return self

    def _write(self, fn: Callable[[lmdb.Transaction], _T]) -> _T:
        """Run fn in one synced write transaction (or in save()'s), growing a full map and retrying."""
        if self._txn is not None:
            return fn(self._txn)
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    return fn(txn)
            except lmdb.MapFullError:
                self._grow()

    def _grow(self) -> None:
        self._map_size *= 2
        self._env.set_mapsize(self._map_size)
        log.info("state store %s map grown to %d MiB", self._path, self._map_size >> 20)

    @contextmanager
    def _reading(self) -> Iterator[lmdb.Transaction]:
        """A read transaction, or save()'s write transaction so reads see its own writes."""
        if self._txn is not None:
            yield self._txn
            return
        with self._env.begin() as txn:
            yield txn


def _check_dropping_torn_tail(env: lmdb.Environment, dbs: dict[str, Any], meta: Meta,
                              path: Path) -> tuple[tuple[int, int], ClusterState]:
    """check_contents less a torn last entry (txn.torn_tail): an uncommitted write cut short at
    power loss. One transaction: if the rest fails its checks the entry stays, so a store moved
    aside is the bytes found."""
    with env.begin(write=True) as txn:
        index = torn_tail(txn, dbs["log"], meta)
        if index is not None:
            txn.delete(encode_key(index), db=dbs["log"])
        checked = check_contents(txn, dbs, meta)
    if index is not None:
        log.warning("store %s: discarded entry %d, torn by a write cut short (uncommitted; the leader "
                    "sends it again)", path, index)
    return checked


def _open_dbs(env: lmdb.Environment) -> dict[str, Any]:
    with env.begin(write=True) as txn:
        return {n: env.open_db(n.encode(), txn=txn, create=True) for n in ("meta", "log", "state", "snap")}


def _read_meta_fields(env: lmdb.Environment) -> dict[str, Any] | None:
    """Decoded meta fields, or None when the environment has no meta sub-db yet (a new store)."""
    with env.begin() as txn:
        try:
            db = env.open_db(b"meta", txn=txn, create=False)
        except lmdb.NotFoundError:
            return None
        raw = {bytes(k): bytes(v) for k, v in txn.cursor(db=db)}
    try:
        return decode_raw(raw)
    except BadMeta as exc:
        raise _Unusable(str(exc)) from exc
