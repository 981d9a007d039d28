"""A store whose disk starts refusing writes on demand: its LMDB environment wrapped so that a
write transaction raises the error given (lmdb.DiskError, ENOSPC; a bare lmdb.Error, as EIO
comes) on put, delete and commit, as a full or failing disk does. Reads still work."""

from __future__ import annotations

from typing import Any

import lmdb


class _Txn:
    def __init__(self, txn: Any, error: lmdb.Error) -> None:
        self._txn, self._error = txn, error

    def put(self, *a: Any, **k: Any) -> Any:
        raise self._error

    def delete(self, *a: Any, **k: Any) -> Any:
        raise self._error

    def commit(self) -> None:
        self._txn.abort()
        raise self._error

    def abort(self) -> None:
        self._txn.abort()

    def __enter__(self) -> _Txn:
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if et is None:
            self.commit()
        else:
            self.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class FailingEnv:
    """env's stand-in: reads as env; write transactions fail with `error` once `failing` is set;
    set_mapsize raises `resize_error`, and begin(write=True) `begin_error`, when set."""

    def __init__(self, env: lmdb.Environment, error: lmdb.Error | None = None) -> None:
        self._env = env
        self.error = error or lmdb.DiskError("mdb_txn_commit", "No space left on device")
        self.failing = False
        self.resize_error: lmdb.Error | None = None
        self.begin_error: lmdb.Error | None = None

    def begin(self, *a: Any, write: bool = False, **k: Any) -> Any:
        if write and self.begin_error is not None:
            raise self.begin_error
        txn = self._env.begin(*a, write=write, **k)
        return _Txn(txn, self.error) if write and self.failing else txn

    def open_db(self, *a: Any, txn: Any = None, **k: Any) -> Any:
        return self._env.open_db(*a, txn=txn._txn if isinstance(txn, _Txn) else txn, **k)

    def set_mapsize(self, size: int) -> None:
        if self.resize_error is not None:
            raise self.resize_error
        self._env.set_mapsize(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def failing(store: Any, error: lmdb.Error | None = None) -> FailingEnv:
    """Wrap store's environment (not yet failing); set .failing = True to make the disk refuse."""
    env = FailingEnv(store.disk.env, error)
    store.disk.env = env
    return env
