"""Every way a write can fail on the disk ends as StoreWriteFailed, remembered: a full map whose
growth the OS refuses too (set_mapsize), in a plain write and in save()'s batch, and a write
transaction LMDB will not begin."""

from __future__ import annotations

from pathlib import Path

import lmdb
import pytest

from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.errors import StoreWriteFailed
from dpeer.statemachine.store import Store
from tests.support.failing_disk import FailingEnv, failing


def entry(index: int) -> Entry:
    return Entry(index, 1, EntryKind.KV_PUT, {"key": f"k{index}", "value": "x" * 1000})


@pytest.mark.parametrize("batched", [False, True])
def test_a_full_map_that_cannot_grow_fails_the_write_for_good(tmp_path: Path, batched: bool) -> None:
    store = Store.open(tmp_path / "s", node_id="n1", map_size=64 << 10)
    env = failing(store)
    env.resize_error = lmdb.MemoryError("mdb_env_set_mapsize", "Cannot allocate memory")
    try:
        with pytest.raises(StoreWriteFailed, match="set_mapsize"):
            for index in range(1, 1000):
                if batched:
                    store.save(1, None, [entry(index)], 0)
                else:
                    store.append([entry(index)])
        written = store.last_index
        env.resize_error = None
        with pytest.raises(StoreWriteFailed):  # refused for good, even with room now
            store.set_hard_state(3, None)
        assert store.current_term == (1 if batched else 0) and store.last_index == written
    finally:
        store.close()


@pytest.mark.parametrize("batched", [False, True])
def test_a_write_transaction_that_cannot_begin_fails_the_write_for_good(tmp_path: Path, batched: bool) -> None:
    store = Store.open(tmp_path / "s", node_id="n1")
    env = failing(store)
    env.begin_error = lmdb.PanicError("mdb_txn_begin", "MDB_PANIC: Update of meta page failed")
    try:
        with pytest.raises(StoreWriteFailed, match="MDB_PANIC"):
            store.save(1, None, [entry(1)], 0) if batched else store.append([entry(1)])
        env.begin_error = None
        with pytest.raises(StoreWriteFailed):
            store.set_hard_state(3, None)
        assert store.current_term == 0 and store.last_index == 0
    finally:
        store.close()


@pytest.mark.parametrize("error", [lmdb.DiskError("mdb_txn_commit", "No space left on device"),
                                   lmdb.Error("mdb_txn_commit", "Input/output error")])
def test_a_disk_that_refuses_a_write_at_open_leaves_the_store_where_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         error: lmdb.Error) -> None:
    """Opening writes (a new store's meta record; a torn tail dropped): refused by the disk, the
    open fails with the reason; nothing is moved aside as corrupt (a full disk is no damage)."""
    import dpeer.statemachine.store as store_mod

    real_open = lmdb.open

    def open_failing(*a: object, **k: object) -> FailingEnv:
        env = FailingEnv(real_open(*a, **k), error)
        env.failing = True
        return env

    monkeypatch.setattr(store_mod.lmdb, "open", open_failing)
    with pytest.raises(StoreWriteFailed, match="cannot open the state store"):
        Store.open(tmp_path / "s", node_id="n1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"], "nothing moved aside"
