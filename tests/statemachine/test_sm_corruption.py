"""Damaged stores: each gives a clear error or is moved aside intact, never a crash or silent loss;
a torn uncommitted last entry (a write cut short at power loss) is discarded, the store kept."""

from __future__ import annotations

import logging
from pathlib import Path

import lmdb
import msgpack
import pytest
from tests.support.disk import tear
from tests.support.sm_entries import kv_entries

from dpeer.statemachine.entry import Entry, EntryKind, encode_entry
from dpeer.statemachine.errors import CorruptEntry, StoreFormatError
from dpeer.statemachine.store import DEFAULT_MAP_SIZE, Store, _open_dbs
from dpeer.statemachine.txn import TAIL_CHECK, TORN_ZEROS

MARK = "MARKER-7f3a9c"


def build(path: Path, n: int = 200, marked: int | None = None, applied: int = 0) -> None:
    """A store with n kv entries (entry `marked` carries MARK), term 4 and a vote for n2."""
    with Store.open(path, node_id="n1") as s:
        s.set_hard_state(4, "n2")
        for lo in range(1, n + 1, 500):
            batch = kv_entries(lo, min(n + 1, lo + 500), term=4)
            s.append([Entry(e.index, e.term, EntryKind.NOOP, {"note": MARK}) if e.index == marked else e
                      for e in batch])
        s.set_commit(applied)
        s.apply_to(applied)


def reopen_expect_moved(path: Path, caplog: pytest.LogCaptureFixture) -> tuple[Store, Path]:
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    caplog.set_level(logging.ERROR, logger="dpeer.statemachine")
    store = Store.open(path, node_id="n1")
    aside = store.recovered_from
    assert aside is not None and aside.name.startswith("s.corrupt-")
    assert (aside / "data.mdb").read_bytes() == before["data.mdb"], "the bad store is kept byte for byte"
    assert any("moved aside" in r.message and str(aside) in r.message for r in caplog.records)
    assert store.last_index == 0 and store.node_id == "n1"
    return store, aside


def flip_marker(path: Path) -> int:
    data = bytearray((path / "data.mdb").read_bytes())
    hits, at = 0, data.find(MARK.encode())
    while at != -1:
        data[at + 3] ^= 0x01
        hits += 1
        at = data.find(MARK.encode(), at + 1)
    (path / "data.mdb").write_bytes(bytes(data))
    return hits


@pytest.mark.parametrize("keep", [0, 100, 0.5])
def test_truncated_data_file_is_moved_aside(tmp_path: Path, keep: float,
                                            caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    build(path, n=3000)
    data = path / "data.mdb"
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(int(size * keep) if isinstance(keep, float) else keep)
    store, _ = reopen_expect_moved(path, caplog)
    with store:
        assert store.current_term == 0, "nothing could be salvaged from a torn file"
        store.append(kv_entries(1, 3))


@pytest.mark.parametrize("pages", [(0,), (1,), (0, 1)])
def test_garbage_in_meta_pages_is_moved_aside(tmp_path: Path, pages: tuple[int, ...],
                                              caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    build(path)
    with open(path / "data.mdb", "r+b") as f:
        for p in pages:
            f.seek(p * 4096)
            f.write(bytes((i * 37 + 11) % 256 for i in range(4096)))
    store, _ = reopen_expect_moved(path, caplog)
    store.close()


def test_crc_bad_entry_in_tail_is_moved_aside_keeping_term_and_vote(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    build(path, n=200, marked=150, applied=100)
    with Store.open(path) as s:
        old_uid = s.uid
    assert flip_marker(path) >= 1
    store, _ = reopen_expect_moved(path, caplog)
    with store:
        assert (store.current_term, store.voted_for) == (4, "n2"), "a fresh store must not vote twice"
        assert store.uid != old_uid, "nor vote or acknowledge as the store whose log it lost"


def test_crc_bad_entry_below_the_checked_tail_raises_on_read(tmp_path: Path) -> None:
    path = tmp_path / "s"
    n = TAIL_CHECK + 600
    build(path, n=n, marked=10, applied=n)
    assert flip_marker(path) >= 1
    with Store.open(path) as s:
        assert s.recovered_from is None
        assert len(s.entries(11, 20)) == 9
        with pytest.raises(CorruptEntry, match="entry 10: CRC mismatch"):
            s.entries(5, 20)


def test_newer_format_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "s"
    build(path)
    with Store.open(path) as s:
        s.disk.write(lambda txn: txn.put(b"format_version", msgpack.packb(99), db=s.disk.dbs["meta"]))
    before = (path / "data.mdb").read_bytes()
    with pytest.raises(StoreFormatError, match="format version 99 is newer"):
        Store.open(path, node_id="n1")
    assert (path / "data.mdb").read_bytes() == before
    assert not list(tmp_path.glob("s.corrupt-*"))


@pytest.mark.parametrize("damage", ["missing_snapshot", "commit_beyond_log", "state_behind_meta", "bad_meta_value"])
def test_inconsistent_contents_are_moved_aside(tmp_path: Path, damage: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    build(path, n=50, applied=40)
    with Store.open(path) as s:
        s.snapshot_now(keep_tail=5)
        meta, snap = s.disk.dbs["meta"], s.disk.dbs["snap"]
        edits = {
            "missing_snapshot": lambda txn: txn.delete(b"current", db=snap),
            "commit_beyond_log": lambda txn: txn.put(b"commit_index", msgpack.packb(99), db=meta),
            "state_behind_meta": lambda txn: txn.put(b"last_applied", msgpack.packb(41), db=meta),
            "bad_meta_value": lambda txn: txn.put(b"current_term", b"\xc1", db=meta),
        }
        s.disk.write(edits[damage])
    store, _ = reopen_expect_moved(path, caplog)
    store.close()


def test_moved_aside_names_do_not_collide(tmp_path: Path) -> None:
    path = tmp_path / "s"
    asides = set()
    for _ in range(3):
        build(path, n=5)
        with open(path / "data.mdb", "r+b") as f:
            f.truncate(10)
        with Store.open(path, node_id="n1") as s:
            asides.add(s.recovered_from)
    assert len(asides) == 3 and all(p is not None and (p / "data.mdb").exists() for p in asides)


def torn_after(path: Path, n: int, offset: int) -> Entry:
    """Entry n + 1 appended torn at `offset` (a write cut short at power loss) to the closed store."""
    entry = kv_entries(n + 1, n + 2, term=4)[0]
    tear(path, entry, offset)
    return entry


@pytest.mark.parametrize("offset", [1, 20, len(encode_entry(kv_entries(201, 202, term=4)[0])) - TORN_ZEROS])
def test_a_torn_uncommitted_last_entry_is_discarded_keeping_the_store(
        tmp_path: Path, offset: int, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    build(path, n=200, applied=150)
    with Store.open(path) as s:
        before = (s.uid, s.current_term, s.voted_for, s.commit_index, s.last_index)
    torn_after(path, 200, offset)
    caplog.set_level(logging.WARNING, logger="dpeer.statemachine")
    with Store.open(path) as s:
        assert s.recovered_from is None
        assert (s.uid, s.current_term, s.voted_for, s.commit_index, s.last_index) == before
        assert any("entry 201, torn" in r.message for r in caplog.records)
        s.append(kv_entries(201, 203, term=5))
        assert s.last_index == 202


def test_a_lost_append_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "s"
    build(path, n=200, applied=150)
    torn_after(path, 200, 0)
    with Store.open(path) as s:
        assert s.recovered_from is None and s.last_index == 200


def test_a_damaged_last_entry_is_no_torn_write(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A flipped byte leaves no run of zeros at the end: damage, moved aside as before (the entry
    may have been acknowledged; the store must not keep voting as the member that held it)."""
    path = tmp_path / "s"
    build(path, n=200, marked=200, applied=150)
    assert flip_marker(path) >= 1
    reopen_expect_moved(path, caplog)[0].close()


def test_a_torn_entry_at_or_below_the_commit_index_is_damage(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A committed entry was written by a write that returned: torn now, it was damaged since."""
    path = tmp_path / "s"
    build(path, n=200, applied=200)
    tear(path, kv_entries(200, 201, term=4)[0], 10)
    reopen_expect_moved(path, caplog)[0].close()


def test_two_torn_entries_are_damage_and_the_store_is_moved_aside_untouched(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Only one write can be cut short: a torn entry before a torn last one is damage, and the
    store moved aside must be the bytes found, the last entry included (not less the torn tail)."""
    path = tmp_path / "s"
    build(path, n=200, applied=150)
    torn_after(path, 200, 10)
    torn_after(path, 201, 10)
    reopen_expect_moved(path, caplog)[0].close()


def test_a_torn_last_entry_over_damage_leaves_the_moved_aside_store_untouched(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    build(path, n=200, marked=190, applied=150)
    assert flip_marker(path) >= 1
    torn_after(path, 200, 10)
    reopen_expect_moved(path, caplog)[0].close()


def test_a_crash_while_creating_leaves_a_store_that_is_moved_aside(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """_create commits the sub-dbs before the meta record: power lost between the two leaves an
    empty meta sub-db, which must not make every later open raise a bare BadMeta."""
    path = tmp_path / "s"
    path.mkdir()
    env = lmdb.open(str(path), map_size=DEFAULT_MAP_SIZE, max_dbs=8, subdir=True)
    _open_dbs(env)
    env.close()
    store, _ = reopen_expect_moved(path, caplog)
    store.close()


@pytest.mark.parametrize("version", [None, "1", 0])
def test_a_damaged_format_version_is_moved_aside_keeping_term_and_vote(
        tmp_path: Path, version: object, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    build(path, n=5)
    with Store.open(path) as s:
        meta = s.disk.dbs["meta"]
        s.disk.write(lambda txn: txn.delete(b"format_version", db=meta) if version is None
                     else txn.put(b"format_version", msgpack.packb(version), db=meta))
    store, _ = reopen_expect_moved(path, caplog)
    assert (store.current_term, store.voted_for) == (4, "n2")
    store.close()
