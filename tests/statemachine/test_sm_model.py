"""Hypothesis state machine: the Store against a plain in-memory Raft log model, with reopens."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.errors import CommittedEntryError, Compacted
from dpeer.statemachine.state import ClusterState, apply_many
from dpeer.statemachine.store import Store


class StoreVsModel(RuleBasedStateMachine):
    """Random appends (overlapping, conflicting), commits, applies, snapshots, truncations, reopens."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="sm-model-"))
        self.store = Store.open(self.dir / "s", node_id="n")
        self.log: list[Entry] = []  # model: entries 1..len, index i at position i-1
        self.commit = 0
        self.applied = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir)

    def _make(self, start: int, n: int, bump: int, key: int) -> list[Entry]:
        base = self.log[start - 2].term if start > 1 else 1
        return [Entry(i, base + bump, EntryKind.KV_PUT, {"key": f"k{(i + key) % 5}", "value": f"{i}.{bump}"})
                for i in range(start, start + n)]

    @rule(back=st.integers(0, 6), n=st.integers(1, 8), bump=st.integers(0, 2), key=st.integers(0, 4))
    def append(self, back: int, n: int, bump: int, key: int) -> None:
        start = max(1, len(self.log) + 1 - back)
        new = self._make(start, n, bump, key)
        keep = start - 1
        s = self.store
        for e in new:  # Raft's rule: skip matching (or compacted) entries, cut at the first conflict
            compacted = e.index < s.first_index and e.index != s.snapshot_index
            if compacted or e.index <= len(self.log) and self.log[e.index - 1].term == e.term:
                keep = e.index
                continue
            break
        conflict_at = keep + 1
        rest = [e for e in new if e.index >= conflict_at]
        if rest and conflict_at <= self.commit:
            try:
                self.store.append(new)
            except CommittedEntryError:
                return
            raise AssertionError("append over a committed conflicting entry was accepted")
        self.store.append(new)
        if rest:
            self.log = self.log[: conflict_at - 1] + rest

    @rule(k=st.integers(0, 10))
    def commit_some(self, k: int) -> None:
        target = min(len(self.log), self.commit + k)
        self.store.set_commit(target)
        self.commit = max(self.commit, target)

    @rule(k=st.integers(0, 10))
    def apply_some(self, k: int) -> None:
        done = self.store.apply_to(self.applied + k)
        want = self.log[self.applied: min(self.commit, self.applied + k)]
        assert [e for e, _ in done] == want
        self.applied += len(want)

    @rule(keep=st.integers(0, 5))
    def snapshot(self, keep: int) -> None:
        self.store.snapshot_now(keep_tail=keep)

    @rule(back=st.integers(0, 5))
    def truncate(self, back: int) -> None:
        at = max(1, len(self.log) + 1 - back)
        if at <= self.commit:
            try:
                self.store.truncate_suffix(at)
            except CommittedEntryError:
                return
            raise AssertionError("truncating committed entries was accepted")
        self.store.truncate_suffix(at)
        self.log = self.log[: at - 1]

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = Store.open(self.dir / "s")
        assert self.store.recovered_from is None

    @invariant()
    def matches_model(self) -> None:
        s = self.store
        assert (s.last_index, s.commit_index, s.last_applied) == (len(self.log), self.commit, self.applied)
        assert s.last_term == (self.log[-1].term if self.log else 0)
        assert s.entries(s.first_index, s.last_index + 1) == self.log[s.first_index - 1:]
        if s.first_index > 1:
            try:
                s.entries(s.first_index - 1, s.last_index + 1)
            except Compacted:
                pass
            else:
                raise AssertionError("reading below first_index did not raise Compacted")
            assert s.term_at(s.snapshot_index) == self.log[s.snapshot_index - 1].term
        expect, _ = apply_many(ClusterState(), self.log[: self.applied])
        assert s.state == expect


StoreVsModel.TestCase.settings = settings(max_examples=80, stateful_step_count=35, deadline=None)
TestStoreVsModel = StoreVsModel.TestCase
