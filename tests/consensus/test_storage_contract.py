"""The Storage contract as a table of cases, run against every factory in FACTORIES:
the in-memory fake and the real LMDB Store behind the daemon's adapter, so the fake the
simulations rely on is checked against the real thing.
"""

from __future__ import annotations

import atexit
import itertools
import tempfile
from typing import Callable

import pytest

from dpeer.consensus import HardState, VotingConfig, MemoryStorage, Snapshot, Storage
from dpeer.daemon.node.storage_adapter import StoreStorage
from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.snapshot import encode_snapshot
from dpeer.statemachine.state import ClusterState
from dpeer.statemachine.errors import (
    Compacted,
    CommittedEntryError,
    HardStateError,
    LogGapError,
    StaleSnapshot,
)

_TMP = tempfile.TemporaryDirectory(prefix="dpeer-contract-")
atexit.register(_TMP.cleanup)
_SEQ = itertools.count()


def lmdb_storage() -> Storage:
    """A fresh LMDB store in its own folder, seen through the daemon's adapter."""
    from dpeer.statemachine.store import Store

    return StoreStorage(Store.open(f"{_TMP.name}/s{next(_SEQ)}", node_id="a"))


FACTORIES: dict[str, Callable[[], Storage]] = {"memory": MemoryStorage, "lmdb": lmdb_storage}
UIDS = {n: f"{i:032x}" for i, n in enumerate("abc", 1)}
CONF = VotingConfig.of(["a", "b", "c"], [], UIDS)


def snap(index: int, term: int) -> Snapshot:
    """A real encoded cluster state at (index, term) with CONF, valid for every storage."""
    state = ClusterState(applied_index=index, applied_term=term, voters=tuple(sorted(CONF.voters)),
                         uids=UIDS, epoch=1)
    return Snapshot(index, term, encode_snapshot(state).data, CONF)


def ents(lo: int, hi: int, term: int) -> list[Entry]:
    return [Entry(i, term, EntryKind.KV_PUT, {"key": f"k{i}", "value": "v" * 10}) for i in range(lo, hi)]


def filled(make: Callable[[], Storage]) -> Storage:
    """Entries 1..10: 1-5 in term 1, 6-10 in term 2; commit 5."""
    st = make()
    st.set_hard_state(2, "a")
    st.append(ents(1, 6, 1) + ents(6, 11, 2))
    st.set_commit(5)
    return st


@pytest.fixture(params=sorted(FACTORIES))
def make(request: pytest.FixtureRequest) -> Callable[[], Storage]:
    return FACTORIES[request.param]


def test_an_empty_storage(make: Callable[[], Storage]) -> None:
    st = make()
    assert (st.current_term, st.voted_for, st.commit_index, st.last_applied) == (0, None, 0, 0)
    assert (st.first_index, st.last_index, st.last_term) == (1, 0, 0)
    assert (st.snapshot_index, st.snapshot_term, st.term_at(0), st.term_at(1)) == (0, 0, 0, None)
    assert st.entries(1, 5) == [] and st.snapshot().index == 0


def test_every_new_storage_has_an_identity_of_its_own(make: Callable[[], Storage]) -> None:
    a, b = make(), make()
    assert len(a.uid) == 32 and set(a.uid) <= set("0123456789abcdef") and a.uid != b.uid


def test_hard_state_never_goes_back_nor_changes_a_vote(make: Callable[[], Storage]) -> None:
    st = make()
    st.set_hard_state(3, None)
    st.set_hard_state(3, "b")
    st.set_hard_state(3, "b")
    with pytest.raises(HardStateError):
        st.set_hard_state(3, "c")
    with pytest.raises(HardStateError):
        st.set_hard_state(2, None)
    st.set_hard_state(4, "c")
    assert (st.current_term, st.voted_for) == (4, "c")


@pytest.mark.parametrize("batch, last, last_term, error", [
    (ents(11, 13, 2), 12, 2, None),                  # plain append
    (ents(8, 11, 2), 10, 2, None),                   # already held: nothing changes
    (ents(8, 10, 3), 9, 3, None),                    # conflict at 8: truncate the suffix
    (ents(9, 15, 2)[:1] + ents(10, 12, 3), 11, 3, None),  # held prefix, conflict at 10
    (ents(13, 14, 2), 10, 2, LogGapError),           # hole after 10
    (ents(5, 7, 3), 10, 2, CommittedEntryError),     # would rewrite committed entry 5
])
def test_append_keeps_matching_entries_and_truncates_conflicts(
        make: Callable[[], Storage], batch: list[Entry], last: int, last_term: int,
        error: type[Exception] | None) -> None:
    st = filled(make)
    if error is None:
        st.append(batch)
    else:
        with pytest.raises(error):
            st.append(batch)
    assert (st.last_index, st.last_term, st.term_at(last)) == (last, last_term, last_term)


def test_save_writes_all_or_nothing(make: Callable[[], Storage]) -> None:
    """StorageWriter.save, what ready.persist calls for the daemon and the simulations alike: hard
    state, entries and commit index in one write; on an error none of it is written."""
    st = filled(make)
    st.save(HardState(3, "b", 8), ents(11, 12, 3))
    assert (st.current_term, st.voted_for, st.commit_index, st.last_index) == (3, "b", 8, 11)
    with pytest.raises(CommittedEntryError):
        st.save(HardState(4, "c", 9), ents(7, 9, 4))
    assert (st.current_term, st.voted_for, st.commit_index, st.last_index, st.last_term) == (3, "b", 8, 11, 3)
    st.save(None, ents(12, 13, 3))
    assert (st.current_term, st.voted_for, st.commit_index, st.last_index) == (3, "b", 8, 12)


def test_entries_ranges_byte_limits_and_compaction(make: Callable[[], Storage]) -> None:
    st = filled(make)
    assert [e.index for e in st.entries(3, 7)] == [3, 4, 5, 6]
    assert [e.index for e in st.entries(9, 99)] == [9, 10]
    assert len(st.entries(1, 11, max_bytes=1)) == 1  # at least one entry
    assert 1 < len(st.entries(1, 11, max_bytes=150)) < 10
    assert st.term_at(6) == 2 and st.term_at(11) is None


def test_commit_only_moves_forward_and_apply_stops_at_commit(make: Callable[[], Storage]) -> None:
    st = filled(make)
    st.set_commit(3)
    assert st.commit_index == 5
    with pytest.raises(ValueError):
        st.set_commit(11)
    st.apply_to(99)
    assert st.last_applied == 5


def test_install_snapshot_discards_a_diverging_log(make: Callable[[], Storage]) -> None:
    st = filled(make)
    st.install_snapshot(snap(20, 4))
    assert (st.snapshot_index, st.snapshot_term, st.commit_index, st.last_applied) == (20, 4, 20, 20)
    assert (st.first_index, st.last_index, st.last_term, st.term_at(20)) == (21, 20, 4, 4)
    assert st.term_at(10) is None and st.snapshot().membership == CONF
    with pytest.raises(Compacted):
        st.entries(10, 21)
    st.append(ents(21, 23, 4))
    assert st.last_index == 22
    with pytest.raises(StaleSnapshot):
        st.install_snapshot(snap(20, 4))


def test_install_snapshot_keeps_a_matching_tail(make: Callable[[], Storage]) -> None:
    st = filled(make)
    st.install_snapshot(snap(7, 2))
    assert (st.first_index, st.last_index, st.commit_index) == (8, 10, 7)
    assert [e.index for e in st.entries(8, 11)] == [8, 9, 10]
