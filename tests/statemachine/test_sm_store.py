"""Store: the durable log, hard state, commit/apply, snapshots and compaction, map growth."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from tests.support.sm_entries import kv_entries

from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.errors import (
    CommittedEntryError,
    Compacted,
    HardStateError,
    LogGapError,
    NodeIdMismatch,
    StaleSnapshot,
    StoreClosed,
    StoreError,
    StoreForkedError,
)
from dpeer.statemachine.state import ClusterState
from dpeer.statemachine.store import Store


def open_store(tmp_path: Path, **kw: object) -> Store:
    return Store.open(tmp_path / "s", node_id="n1", **kw)  # type: ignore[arg-type]


def test_create_and_reopen_keeps_everything(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    assert (s.node_id, s.current_term, s.voted_for, s.last_index, s.first_index) == ("n1", 0, None, 0, 1)
    s.set_hard_state(3, "n2")
    s.append(kv_entries(1, 11, term=3))
    s.set_commit(8)
    s.apply_to(6)
    s.close()
    with pytest.raises(StoreClosed):
        s.append(kv_entries(11, 12, term=3))
    with Store.open(tmp_path / "s") as r:
        assert (r.current_term, r.voted_for, r.commit_index, r.last_applied) == (3, "n2", 8, 6)
        assert (r.last_index, r.last_term, r.recovered_from) == (10, 3, None)
        assert r.state.kv["k6"] == "v6" and r.state.applied_index == 6
        assert r.entries(1, 11) == kv_entries(1, 11, term=3)


def test_a_store_keeps_its_identity_and_a_new_store_gets_a_new_one(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        uid = s.uid
    assert len(uid) == 32 and set(uid) <= set("0123456789abcdef")
    with Store.open(tmp_path / "s") as r:
        assert r.uid == uid
    (tmp_path / "s").rename(tmp_path / "s.moved-aside")  # the operator's wipe: moved aside, never deleted
    with open_store(tmp_path) as fresh:
        assert fresh.node_id == "n1" and fresh.uid != uid


def test_create_needs_node_id_and_refuses_other_nodes_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="node_id"):
        Store.open(tmp_path / "x")
    open_store(tmp_path).close()
    with pytest.raises(NodeIdMismatch, match="belongs to node 'n1'"):
        Store.open(tmp_path / "s", node_id="n2")
    assert not list(tmp_path.glob("s.corrupt-*"))


def test_hard_state_rules(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        s.set_hard_state(2, None)
        s.set_hard_state(2, "a")
        s.set_hard_state(2, "a")
        with pytest.raises(HardStateError, match="already voted"):
            s.set_hard_state(2, "b")
        with pytest.raises(HardStateError, match="below"):
            s.set_hard_state(1, None)
        s.set_hard_state(5, None)
        assert (s.current_term, s.voted_for) == (5, None)


def test_append_guards(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        with pytest.raises(LogGapError, match="gap"):
            s.append(kv_entries(2, 4))
        with pytest.raises(LogGapError, match="contiguous"):
            s.append(kv_entries(1, 2) + kv_entries(3, 4))
        s.append(kv_entries(1, 4, term=2))
        with pytest.raises(LogGapError, match="below previous term"):
            s.append(kv_entries(4, 5, term=1))
        assert s.last_index == 3


def test_log_matching_keeps_matching_prefix_and_truncates_conflicts(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        s.append(kv_entries(1, 11, term=1))
        s.set_commit(5)
        s.append(kv_entries(3, 7, term=1))  # a retransmit of held entries changes nothing
        assert s.last_index == 10
        s.append(kv_entries(6, 8, term=1) + kv_entries(8, 9, term=2))
        assert (s.last_index, s.last_term) == (8, 2)
        assert [s.term_at(i) for i in range(6, 10)] == [1, 1, 2, None]
        with pytest.raises(CommittedEntryError):
            s.append(kv_entries(5, 6, term=2))
        with pytest.raises(CommittedEntryError):
            s.truncate_suffix(5)
        s.truncate_suffix(6)
        assert s.last_index == 5 and s.last_term == 1
        assert s.entries(1, 100) == kv_entries(1, 6)


def test_append_true_silent_false_is_caught(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        s.append(kv_entries(1, 6))
        s.log.last_index = 3  # a stale cache: the store believes 4 and 5 are free
        with pytest.raises(StoreError, match="out of order"):
            s.append([Entry(4, 1, EntryKind.NOOP, {})])
        s.log.last_index = 5
        assert s.entries(1, 6) == kv_entries(1, 6), "the refused append wrote nothing"


def test_commit_is_monotonic_and_bounded(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        s.append(kv_entries(1, 6))
        s.set_commit(4)
        s.set_commit(2)
        assert s.commit_index == 4
        with pytest.raises(ValueError, match="beyond last index"):
            s.set_commit(6)


def test_apply_to_stops_at_commit_and_reports_results(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        s.append(kv_entries(1, 6) + [Entry(6, 1, EntryKind.KV_DELETE, {"key": "nope"})])
        s.set_commit(6)
        done = s.apply_to(4)
        assert [e.index for e, _ in done] == [1, 2, 3, 4] and all(r.accepted for _, r in done)
        done = s.apply_to(100)
        assert [(e.index, r.accepted) for e, r in done] == [(5, True), (6, False)]
        assert s.apply_to(100) == [] and s.last_applied == 6


def test_crash_between_append_and_apply_reapplies_exactly_once(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    s.append(kv_entries(1, 4))
    s.set_commit(3)
    s.apply_to(1)
    s.close()  # as after a crash: 2..3 committed, not applied
    with Store.open(tmp_path / "s") as r:
        assert r.last_applied == 1 and r.state.applied_index == 1
        assert [e.index for e, _ in r.apply_to(10)] == [2, 3]
    with Store.open(tmp_path / "s") as r:
        assert r.apply_to(10) == [] and r.last_applied == 3
        assert dict(r.state.kv) == {"k1": "v1", "k2": "v2", "k3": "v3"}


def test_compaction_boundaries(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        s.append(kv_entries(1, 31, term=1) + kv_entries(31, 41, term=2))
        s.set_commit(35)
        s.apply_to(35)
        assert not s.maybe_snapshot(every=36, keep_tail=5)
        assert s.maybe_snapshot(every=35, keep_tail=5)
        assert (s.snapshot_index, s.snapshot_term, s.first_index) == (35, 2, 31)
        with pytest.raises(Compacted):
            s.entries(30, 33)
        assert [e.index for e in s.entries(31, 33)] == [31, 32]
        assert s.term_at(30) is None and s.term_at(31) == 2 and s.term_at(35) == 2
        assert s.term_at(0) == 0 and s.term_at(41) is None
        s.close()
    with Store.open(tmp_path / "s") as r:
        assert (r.first_index, r.last_index, r.snapshot_index, r.last_applied) == (31, 40, 35, 35)
        assert r.state.kv["k0"] == "v35"
        r.append(kv_entries(36, 41, term=2))  # retransmits across the tail are accepted
        r.set_commit(40)
        r.apply_to(40)
        r.snapshot_now(keep_tail=0)
        assert (r.first_index, r.last_index, r.last_term) == (41, 40, 2)
        assert r.entries(41, 50) == [] and r.term_at(40) == 2
        r.append(kv_entries(41, 42, term=3))
        assert r.last_index == 41


def test_entries_max_bytes_returns_at_least_one(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        s.append(kv_entries(1, 101))
        assert len(s.entries(1, 101, max_bytes=1)) == 1
        some = s.entries(1, 101, max_bytes=300)
        assert 1 < len(some) < 100 and some == kv_entries(1, 1 + len(some))
        assert s.entries(90, 1000) == kv_entries(90, 101)


def test_install_snapshot_non_matching_log_is_discarded(tmp_path: Path) -> None:
    leader = Store.open(tmp_path / "leader", node_id="L")
    leader.append(kv_entries(1, 21, term=2))
    leader.set_commit(20)
    leader.apply_to(20)
    leader.snapshot_now(keep_tail=0)
    snap = leader.snapshot()
    with Store.open(tmp_path / "f", node_id="F") as f:
        f.append(kv_entries(1, 26, term=1))  # a stale, longer log from an old term
        f.install_snapshot(snap.index, snap.term, snap.data)
        assert (f.last_index, f.last_term, f.first_index, f.commit_index, f.last_applied) == (20, 2, 21, 20, 20)
        assert f.state == leader.state
        with pytest.raises(StaleSnapshot):
            f.install_snapshot(snap.index, snap.term, snap.data)
    with Store.open(tmp_path / "f") as f:
        assert f.state == leader.state and f.snapshot() == snap
    leader.close()


def test_install_snapshot_matching_log_keeps_tail(tmp_path: Path) -> None:
    with Store.open(tmp_path / "l", node_id="L") as leader:
        leader.append(kv_entries(1, 11))
        leader.set_commit(10)
        leader.apply_to(10)
        snap = leader.snapshot_now(keep_tail=2)
    with Store.open(tmp_path / "f", node_id="F") as f:
        f.append(kv_entries(1, 16))
        bad = bytearray(snap.data)
        bad[-2] ^= 1
        with pytest.raises(ValueError):
            f.install_snapshot(snap.index, snap.term, bytes(bad))
        assert f.last_index == 15 and f.commit_index == 0, "a bad snapshot touches nothing"
        f.install_snapshot(snap.index, snap.term, snap.data)
        assert (f.first_index, f.last_index, f.last_applied) == (11, 15, 10)
        assert f.entries(11, 16) == kv_entries(11, 16)
        f.set_commit(15)
        f.apply_to(15)
        assert f.state.kv["k1"] == "v15"


def test_snapshot_of_a_fresh_store_is_the_empty_state(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        snap = s.snapshot()
        assert (snap.index, snap.term) == (0, 0)
        assert s.snapshot_now().index == 0 and s.state == ClusterState()


def test_map_grows_when_full(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dpeer.statemachine")
    with open_store(tmp_path, map_size=128 << 10) as s:
        payload = "x" * 2000
        for lo in range(1, 2001, 100):
            s.append([Entry(i, 1, EntryKind.KV_PUT, {"key": "k", "value": payload}) for i in range(lo, lo + 100)])
        assert s.last_index == 2000
    assert any("map grown" in r.message for r in caplog.records)
    with Store.open(tmp_path / "s", map_size=128 << 10) as r:
        assert r.last_index == 2000 and r.entries(1999, 2001)[1].payload["value"] == payload


def test_save_grows_a_full_map_and_writes_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A save past the map is aborted, its caches undone, the map grown and the save run again."""
    caplog.set_level(logging.INFO, logger="dpeer.statemachine")
    payload = "x" * 2000
    batch = [Entry(i, 2, EntryKind.KV_PUT, {"key": "k", "value": payload}) for i in range(1, 301)]
    with open_store(tmp_path, map_size=128 << 10) as s:
        s.save(2, "n2", batch, 300)
        assert (s.current_term, s.voted_for, s.last_index, s.last_term, s.commit_index) == (2, "n2", 300, 2, 300)
    assert any("map grown" in r.message for r in caplog.records)
    with Store.open(tmp_path / "s") as r:
        assert (r.current_term, r.voted_for, r.last_index, r.commit_index) == (2, "n2", 300, 300)
        assert r.entries(1, 301) == batch


def test_the_fields_are_read_only(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        for name in ("current_term", "commit_index", "last_index", "state", "uid"):
            with pytest.raises(AttributeError, match="read-only"):
                setattr(s, name, 5)
        assert (s.current_term, s.commit_index, s.last_index) == (0, 0, 0)


def test_use_after_fork_is_refused(tmp_path: Path) -> None:
    with open_store(tmp_path) as s:
        s.append(kv_entries(1, 3))
        pid = os.fork()
        if pid == 0:
            try:
                s.entries(1, 3)
                code = 1
            except StoreForkedError:
                code = 0
            except BaseException:
                code = 2
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert s.entries(1, 3) == kv_entries(1, 3)


def test_save_persists_hard_state_entries_and_commit_together(tmp_path) -> None:
    from dpeer.statemachine.entry import Entry, EntryKind
    from dpeer.statemachine.errors import HardStateError
    from dpeer.statemachine.store import Store

    kv = lambda i, t: Entry(i, t, EntryKind.KV_PUT, {"key": f"k{i}", "value": "v"})  # noqa: E731
    with Store.open(tmp_path / "s", node_id="a") as st:
        st.save(2, "a", [kv(1, 1), kv(2, 2)], 1)
        assert (st.current_term, st.voted_for, st.last_index, st.commit_index) == (2, "a", 2, 1)
        assert st.term_at(2) == 2
        try:
            st.save(2, "b", [kv(3, 2)], 3)
        except HardStateError:
            pass
        else:
            raise AssertionError("a second vote in term 2 was accepted")
        assert (st.voted_for, st.last_index, st.commit_index) == ("a", 2, 1), "a refused save wrote something"
        st.save(2, "a", [kv(2, 2), kv(3, 2)], 3)
    with Store.open(tmp_path / "s", node_id="a") as st:
        assert (st.current_term, st.voted_for, st.last_index, st.commit_index) == (2, "a", 3, 3)
        assert [e.index for e in st.entries(1, 4)] == [1, 2, 3]
