"""The node's durable state: one LMDB environment holding meta, the log, the applied state and a
snapshot. The only module in dpeer that imports lmdb.

Open it in the daemon only, after any fork: LMDB handles must never cross a fork, and a Store
raises StoreForkedError if it is used from a process other than the one that opened it. Every
write is synced (sync=True, metasync=True) before the call returns. Give the Store a directory of
its own: a store that fails its checks is renamed aside as a whole, never deleted.

Here: the environment (Disk), the checks that open it, and the Store that wires its owners, the
log and hard state (durable_log.py), the applied state (applied.py) and the snapshot
(snapshot_store.py), which get their transactions from the Disk.
"""

from __future__ import annotations

import logging
import os
import resource
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterator, Sequence, TypeVar

import lmdb

from dpeer.ids import SECRETS, Ids, new_uid
from dpeer.statemachine.applied import AppliedState
from dpeer.statemachine.aside import move_aside
from dpeer.statemachine.durable_log import DurableLog
from dpeer.statemachine.entry import Entry, encode_key
from dpeer.statemachine.errors import (
    CorruptEntry,
    CorruptState,
    NodeIdMismatch,
    StoreClosed,
    StoreError,
    StoreForkedError,
    StoreWriteFailed,
)
from dpeer.statemachine.meta import (
    BadMeta,
    Meta,
    check_version,
    decode_raw,
    parse_meta,
    salvage,
)
from dpeer.statemachine.props import Field
from dpeer.statemachine.snapshot import StateSnapshot
from dpeer.statemachine.snapshot_store import SnapshotStore
from dpeer.statemachine.state import ApplyResult, ClusterState, encode_state
from dpeer.statemachine.txn import STATE_KEY, check_contents, put_meta, torn_tail

log = logging.getLogger("dpeer.statemachine")

DEFAULT_MAP_SIZE = 64 << 20
_T = TypeVar("_T")


class _Unusable(Exception):
    """Internal: the store on disk failed a check; carries what could be salvaged from it."""

    def __init__(self, reason: str, fields: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.fields = fields or {}


def _free(path: Path) -> str:
    """What the filesystem under path has left, in words (a full disk is the usual cause)."""
    try:
        stat = os.statvfs(path)
    except OSError as exc:
        return f"its free space is unknown: {exc.strerror}"
    return f"its filesystem has {stat.f_bavail * stat.f_frsize // 1024} KiB free"


class Disk:
    """The open LMDB environment of one store and its sub-databases (dbs): synced write
    transactions, growing a full map, and save()'s one batch transaction. Refused after close or
    from a process other than the one that opened it."""

    def __init__(self, env: lmdb.Environment, dbs: dict[str, Any], path: Path, map_size: int) -> None:
        self.env, self.dbs, self.path = env, dbs, path
        self._map_size = map_size
        self._pid = os.getpid()
        self._closed = False
        self._txn: lmdb.Transaction | None = None
        self.failure: StoreWriteFailed | None = None  # a write the disk refused: every later one is refused

    def live(self) -> None:
        """Refuse use after close or from a forked child."""
        if self._closed:
            raise StoreClosed(f"store {self.path} is closed")
        if os.getpid() != self._pid:
            raise StoreForkedError(f"store {self.path} was opened in process {self._pid}; "
                                   "open a new Store after fork instead")

    def write(self, fn: Callable[[lmdb.Transaction], _T]) -> _T:
        """Run fn in one synced write transaction (or in batch()'s), growing a full map and
        retrying; StoreWriteFailed when the disk refuses it, and for every write after that."""
        if self._txn is not None:
            return fn(self._txn)
        self._refuse_after_failure()
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    return fn(txn)
            except lmdb.MapFullError:
                self._grow()
            except lmdb.Error as exc:
                raise self._failed(exc) from exc

    def batch(self, fn: Callable[[], _T], undo: Callable[[], None]) -> _T:
        """Run fn with every write() and reading() in ONE synced write transaction, committed when
        fn returns. On any error it is aborted, so nothing is written, and undo() restores the
        caches fn changed; a full map grows and fn runs again; StoreWriteFailed as write()."""
        self._refuse_after_failure()
        while True:
            try:
                self._txn = self.env.begin(write=True)
            except lmdb.Error as exc:
                raise self._failed(exc) from exc
            try:
                result = fn()
                self._txn.commit()
                return result
            except BaseException as exc:
                self._txn.abort()
                undo()
                if isinstance(exc, lmdb.MapFullError):
                    self._grow()
                elif isinstance(exc, lmdb.Error):
                    raise self._failed(exc) from exc
                else:
                    raise
            finally:
                self._txn = None

    def _failed(self, exc: lmdb.Error) -> StoreWriteFailed:
        """The failure of a write, kept: every later write is refused with it."""
        self.failure = StoreWriteFailed(
            f"cannot write the state store {self.path}: {exc} ({_free(self.path)}; the write was rolled back: what "
            "was committed before is on disk); free space on the data dir's filesystem or replace the failing "
            "disk, then start the daemon again")
        return self.failure

    def _refuse_after_failure(self) -> None:
        if self.failure is not None:
            raise StoreWriteFailed(str(self.failure))

    def _grow(self) -> None:
        """Double the map; StoreWriteFailed when the OS refuses that too (the write that needed it
        is lost, as any refused write)."""
        try:
            self.env.set_mapsize(self._map_size * 2)
        except lmdb.Error as exc:
            raise self._failed(exc) from exc
        self._map_size *= 2
        log.info("state store %s map grown to %d MiB", self.path, self._map_size >> 20)

    @contextmanager
    def reading(self) -> Iterator[lmdb.Transaction]:
        """A read transaction, or batch()'s write transaction so reads see its own writes."""
        if self._txn is not None:
            yield self._txn
            return
        with self.env.begin() as txn:
            yield txn

    def close(self) -> None:
        """Close the environment (only in the process that opened it); later use raises StoreClosed."""
        if not self._closed and self._pid == os.getpid():
            self.env.close()
        self._closed = True


class Store:
    """Durable Raft storage plus the applied cluster state for one node; one owner, one thread.

    It wires the owners and keeps their public interface: disk (the environment), log (entries,
    bounds, term, vote, commit), applied (the state and last_applied) and snapshots (snapshot
    and first_index). They share meta, the cache of the meta record, each writing its own fields."""

    path = Field[Path]("disk.path", "The LMDB environment directory.")
    node_id = Field[str]("meta.node_id", "The node this store belongs to (fixed at creation).")
    uid = Field[str]("meta.uid", "This store's identity: 32 hex digits drawn when it was created "
                     "(a new disk, a new uid).")
    current_term = Field[int]("meta.current_term", "The latest term this node has seen (durable).")
    voted_for = Field["str | None"]("meta.voted_for", "Whom this node voted for in current_term, "
                                    "if anyone (durable).")
    commit_index = Field[int]("meta.commit_index", "Highest log index known committed (durable, monotonic).")
    last_applied = Field[int]("meta.last_applied", "Highest index applied to `state` (durable, "
                              "written with the state).")
    first_index = Field[int]("meta.first_index", "First index still held in the log "
                             "(snapshot_index + 1 when the log is empty).")
    last_index = Field[int]("log.last_index", "Last index in the log, or the snapshot index when "
                            "the log is empty.")
    last_term = Field[int]("log.last_term", "Term of the entry at last_index.")
    snapshot_index = Field[int]("meta.snapshot_index", "Log index the stored snapshot covers (0: none).")
    snapshot_term = Field[int]("meta.snapshot_term", "Term of the entry at snapshot_index.")
    state = Field[ClusterState]("applied.state", "The applied cluster state as of last_applied.")

    def __init__(self, disk: Disk, meta: Meta, bounds: tuple[int, int], state: ClusterState) -> None:
        self.disk, self.meta = disk, meta
        self.log = DurableLog(disk, meta, bounds)
        self.applied = AppliedState(disk, meta, self.log, state)
        self.snapshots = SnapshotStore(disk, meta, self.log, self.applied)
        self.recovered_from: Path | None = None

    @classmethod
    def open(cls, path: str | Path, *, node_id: str | None = None,
             map_size: int = DEFAULT_MAP_SIZE, ids: Ids = SECRETS) -> Store:
        """Open (or create) the store at the directory `path`; a store that fails its checks is
        renamed to `<path>.corrupt-<timestamp>` and an empty one created in its place. ids: where
        a new store draws its uid."""
        path = Path(path)
        try:
            return _open_checked(path, node_id, map_size, {}, ids)
        except _Unusable as bad:
            aside = move_aside(path)
            nid, term, vote = salvage(bad.fields)
            log.error("state store %s failed its checks (%s); moved aside to %s, starting empty "
                      "and resyncing from peers (kept term %d, vote %s)", path, bad, aside, term, vote)
            if node_id is None and nid is None:
                raise StoreError(f"store {path} was unusable ({bad}) and moved aside to {aside}; "
                                 "pass node_id to create a fresh one") from bad
            salvaged = {"node_id": node_id or nid, "current_term": term, "voted_for": vote}
            store = _open_checked(path, node_id or nid, map_size, salvaged, ids)
            store.recovered_from = aside
            return store

    def set_hard_state(self, term: int, voted_for: str | None) -> None:
        """Durably record term and vote before returning (a vote must be on disk before it is sent)."""
        self.log.set_hard_state(term, voted_for)

    def save(self, term: int, voted_for: str | None, entries: Sequence[Entry], commit: int) -> None:
        """What a Raft Ready persists, in ONE synced transaction: hard state, new entries, commit;
        on any error nothing is written (see DurableLog.save)."""
        self.log.save(term, voted_for, entries, commit)

    def append(self, entries: Sequence[Entry]) -> None:
        """Durably append contiguous entries, truncating a conflicting uncommitted suffix."""
        self.log.append(entries)

    def truncate_suffix(self, from_index: int) -> None:
        """Durably remove entries from from_index to the end; committed entries are never removed."""
        self.log.truncate_suffix(from_index)

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi), stopping past max_bytes (at least one); Compacted below first_index."""
        return self.log.entries(lo, hi, max_bytes)

    def term_at(self, index: int) -> int | None:
        """Term of the entry at index (the snapshot's term at snapshot_index); None if not held."""
        return self.log.term_at(index)

    def set_commit(self, index: int) -> None:
        """Durably raise the commit index (lower values are ignored; it never goes back)."""
        self.log.set_commit(index)

    def apply_to(self, index: int) -> list[tuple[Entry, ApplyResult]]:
        """Apply committed entries up to min(index, commit_index), each batch written with
        last_applied in one transaction."""
        return self.applied.apply_to(index)

    def maybe_snapshot(self, every: int = 10_000, keep_tail: int = 1_000) -> bool:
        """Snapshot and compact once `every` entries were applied since the last snapshot."""
        return self.snapshots.maybe_take(every, keep_tail)

    def snapshot_now(self, keep_tail: int = 1_000) -> StateSnapshot:
        """Durably snapshot the applied state and compact the log, keeping keep_tail entries."""
        return self.snapshots.take(keep_tail)

    def snapshot(self) -> StateSnapshot:
        """The stored snapshot (what a peer behind first_index is sent); the empty state if none."""
        return self.snapshots.stored()

    def install_snapshot(self, index: int, term: int, data: bytes) -> None:
        """Replace the state with a peer's snapshot (validated first); keep the log after index if
        it matches at (index, term), else discard the whole log."""
        self.snapshots.install(index, term, data)

    def close(self) -> None:
        """Close the environment; later calls raise StoreClosed."""
        self.disk.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _open_checked(path: Path, node_id: str | None, map_size: int, salvaged: dict[str, Any],
                  ids: Ids) -> Store:
    """Open the environment at path and check it; a torn data.mdb or one LMDB refuses is _Unusable."""
    path.mkdir(parents=True, exist_ok=True)
    _reserve_lock_file(path)
    data = path / "data.mdb"
    size = data.stat().st_size if data.exists() else None
    if size is not None and size < 2 * resource.getpagesize():
        raise _Unusable(f"data.mdb is torn ({size} bytes, shorter than its two meta pages)")
    try:
        env = lmdb.open(str(path), map_size=max(map_size, size or 0), max_dbs=8, subdir=True,
                        sync=True, metasync=True, readahead=False, meminit=False, lock=True)
    except lmdb.Error as exc:
        _refuse_if_the_disk(exc, path)
        raise _Unusable(f"LMDB refused to open it: {exc}") from exc
    try:
        return _check_env(env, path, node_id, salvaged, ids)
    except lmdb.Error as exc:
        env.close()
        _refuse_if_the_disk(exc, path)
        raise _Unusable(f"LMDB error while checking it: {exc}") from exc
    except BaseException:
        env.close()
        raise


LOCK_BYTES = 64 << 10  # the lock file's room, allocated before LMDB maps it (LMDB needs about 8 KiB for 126 readers)


def _reserve_lock_file(path: Path) -> None:
    """Allocate a missing lock.mdb on the disk before LMDB maps it: LMDB writes it through a
    memory map, so on a disk with no room left the process would die of SIGBUS, saying nothing.
    StoreWriteFailed when the disk cannot hold it (LMDB takes a bigger file as more readers)."""
    lock = path / "lock.mdb"
    if lock.exists():
        return
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, LOCK_BYTES)
    except OSError as exc:
        os.close(fd)
        fd = -1
        lock.unlink(missing_ok=True)
        raise StoreWriteFailed(
            f"cannot create the state store {path}: its lock file does not fit ({exc.strerror}; {_free(path)}); "
            "free space on the data dir's filesystem, then start the daemon again") from exc
    finally:
        if fd >= 0:
            os.close(fd)


def _refuse_if_the_disk(exc: lmdb.Error, path: Path) -> None:
    """StoreWriteFailed when the error is the disk's, not the store's: full (ENOSPC), read-only,
    out of memory, or an OS error LMDB has no name for (EIO). Such a store is not damaged, so it
    is left where it is: moved aside, a good store would be lost to a full disk."""
    if type(exc) is lmdb.Error or isinstance(exc, (lmdb.DiskError, lmdb.ReadonlyError, lmdb.MemoryError)):
        raise StoreWriteFailed(
            f"cannot open the state store {path}: {exc} ({_free(path)}; nothing was changed on disk); free space "
            "on the data dir's filesystem or replace the failing disk, then start the daemon again") from exc


def _check_env(env: lmdb.Environment, path: Path, node_id: str | None, salvaged: dict[str, Any],
               ids: Ids) -> Store:
    """The Store over an opened environment that passed its checks (a new one is created)."""
    size = (path / "data.mdb").stat().st_size
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if size < need:
        raise _Unusable(f"data.mdb is torn ({size} bytes, its meta page says {need})")
    env.reader_check()
    fields = _read_meta_fields(env)
    if fields is None:
        return _create(env, path, node_id, salvaged, ids)
    # A missing or malformed format_version is damage like any bad field (also an empty meta
    # sub-db: power lost in _create between _open_dbs and the meta record); a newer one raises
    # StoreFormatError, refused and left untouched.
    try:
        check_version(fields)
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
    return Store(Disk(env, dbs, path, env.info()["map_size"]), meta, bounds, state)


def _create(env: lmdb.Environment, path: Path, node_id: str | None, salvaged: dict[str, Any],
            ids: Ids) -> Store:
    """A new store in an empty environment: a new uid, and the hard state salvaged if any."""
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
    return Store(Disk(env, dbs, path, env.info()["map_size"]), meta, (0, 0), state)


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
