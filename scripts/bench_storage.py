"""Benchmark dpeer's durable Store against a sqlite3 baseline (WAL, synchronous=FULL), side by side.

Measures durable appends/s (1, 10 and 100 entries per transaction), restart time (open, read meta,
rebuild the applied state) after 10k/100k/1M-entry histories, and the time to serve a delta of 1k
and 10k entries. Each figure is the median of several runs. Usage:
    python scripts/bench_storage.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpeer.statemachine.entry import Entry, EntryKind, pack_payload, unpack_payload  # noqa: E402
from dpeer.statemachine.state import ClusterState, apply_many  # noqa: E402
from dpeer.statemachine.store import Store  # noqa: E402

BUILD_BATCH = 1000
CHUNK = 10_000


def make(lo: int, hi: int) -> list[Entry]:
    """Entries [lo, hi): kv puts over 1000 keys, the bulk of what a long-lived log holds."""
    return [Entry(i, 1, EntryKind.KV_PUT, {"key": f"k{i % 1000}", "value": f"v{i}"}) for i in range(lo, hi)]


def median_of(runs: int, fn: Callable[[], float]) -> float:
    """Median of `runs` results of fn (each a seconds or rate figure)."""
    return statistics.median(fn() for _ in range(runs))


class Sqlite:
    """The baseline: one log table and a meta table in WAL mode with synchronous=FULL."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS log(idx INTEGER PRIMARY KEY, term, kind, payload BLOB)")
        self.db.execute("CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v)")

    def last_index(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(idx), 0) FROM log").fetchone()[0]

    def append(self, entries: list[Entry]) -> None:
        rows = [(e.index, e.term, e.kind.value, pack_payload(e.payload)) for e in entries]
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO log VALUES (?,?,?,?)", rows)
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('commit_index', ?)", (entries[-1].index,))
        self.db.execute("COMMIT")

    def rows(self, lo: int, hi: int) -> list[Entry]:
        cur = self.db.execute("SELECT idx, term, kind, payload FROM log WHERE idx >= ? AND idx < ? ORDER BY idx",
                              (lo, hi))
        return [Entry(i, t, EntryKind(k), unpack_payload(p)) for i, t, k, p in cur]

    def close(self) -> None:
        self.db.close()


def appends_per_s(dpeer_dir: Path, sql_path: Path, batch: int, txns: int) -> tuple[float, float]:
    """Durable entries/s with `batch` entries per transaction, for dpeer then sqlite."""
    def run(append: Callable[[list[Entry]], None], start: int) -> float:
        batches = [make(start + k * batch, start + (k + 1) * batch) for k in range(txns)]
        t = time.perf_counter()
        for b in batches:
            append(b)
        return batch * txns / (time.perf_counter() - t)

    with Store.open(dpeer_dir, node_id="bench") as s:
        d = run(s.append, s.last_index + 1)
    q = Sqlite(sql_path)
    try:
        r = run(q.append, q.last_index() + 1)
    finally:
        q.close()
    return d, r


def build(root: Path, n: int) -> tuple[Path, Path, Path]:
    """Histories of n entries: dpeer with snapshots (every 10k, 1k tail), dpeer without, sqlite."""
    snap, full, sql = root / f"snap{n}", root / f"full{n}", root / f"sql{n}.db"
    with Store.open(snap, node_id="b", map_size=1 << 30) as a, Store.open(full, node_id="b", map_size=1 << 30) as b:
        q = Sqlite(sql)
        for lo in range(1, n + 1, BUILD_BATCH):
            batch = make(lo, min(n + 1, lo + BUILD_BATCH))
            for s in (a, b):
                s.append(batch)
                s.set_commit(batch[-1].index)
            a.apply_to(batch[-1].index)
            a.maybe_snapshot(every=10_000, keep_tail=1_000)
            q.append(batch)
        q.close()
    return snap, full, sql


def restart_snapshot(path: Path) -> float:
    """dpeer's restart: open, read meta, load the applied state (and check the tail)."""
    t = time.perf_counter()
    with Store.open(path) as s:
        assert s.state.applied_index == s.last_applied > 0
    return time.perf_counter() - t


def replay(read: Callable[[int, int], list[Entry]], last: int) -> ClusterState:
    """Rebuild the applied state from index 1 with the pure apply, CHUNK entries at a time."""
    state = ClusterState()
    for lo in range(1, last + 1, CHUNK):
        state, _ = apply_many(state, read(lo, min(last + 1, lo + CHUNK)))
    return state


def restart_full_dpeer(path: Path) -> float:
    """dpeer without snapshots: open, then replay the whole log through apply."""
    t = time.perf_counter()
    with Store.open(path) as s:
        state = replay(s.entries, s.last_index)
    assert state.applied_index > 0
    return time.perf_counter() - t


def restart_sqlite(path: Path) -> float:
    """sqlite: connect, read meta, replay the whole log through the same pure apply."""
    t = time.perf_counter()
    q = Sqlite(path)
    commit = q.db.execute("SELECT v FROM meta WHERE k='commit_index'").fetchone()[0]
    state = replay(q.rows, commit)
    q.close()
    assert state.applied_index == commit
    return time.perf_counter() - t


def serve(read: Callable[[int, int], list[Entry]], last: int, k: int) -> float:
    """Seconds to read and decode the last k entries as a resync would serve them."""
    t = time.perf_counter()
    got = read(last - k + 1, last + 1)
    assert len(got) == k
    return time.perf_counter() - t


def row(name: str, d: float, r: float, unit: str, fmt: str = "{:,.1f}") -> None:
    print(f"{name:<44} {fmt.format(d):>12} {fmt.format(r):>12} {unit:<9} {d / r:>8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller histories and fewer repeats (< 1 min)")
    args = ap.parse_args()
    runs = 3 if args.quick else 5
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    print(f"dpeer storage benchmark, {time.strftime('%Y-%m-%d %H:%M')}, python {platform.python_version()}, "
          f"sqlite {sqlite3.sqlite_version}, {os.cpu_count()} cpus, medians of {runs}")
    print(f"{'measurement':<44} {'dpeer':>12} {'sqlite':>12} {'unit':<9} {'d/sqlite':>8}")
    with tempfile.TemporaryDirectory(prefix="dpeer-bench-") as tmp:
        root = Path(tmp)
        for batch, txns in ((1, 1000), (10, 300), (100, 200)):
            figs = [appends_per_s(root / f"a{batch}", root / f"a{batch}.db", batch, txns) for _ in range(runs)]
            row(f"durable appends, {batch} per txn", statistics.median(f[0] for f in figs),
                statistics.median(f[1] for f in figs), "entries/s", "{:,.0f}")
        for n in sizes:
            snap, full, sql = build(root, n)
            reps = 3 if n >= 1_000_000 else runs
            d = median_of(runs, lambda: restart_snapshot(snap))
            f = median_of(reps, lambda: restart_full_dpeer(full))
            r = median_of(reps, lambda: restart_sqlite(sql))
            row(f"restart after {n:,} (dpeer snapshot+tail)", d * 1e3, r * 1e3, "ms")
            row(f"restart after {n:,} (dpeer full replay)", f * 1e3, r * 1e3, "ms")
            if n == sizes[-1]:
                with Store.open(full) as s:
                    q = Sqlite(sql)
                    for k in (1_000, 10_000):
                        d = median_of(runs, lambda: serve(s.entries, s.last_index, k))
                        r = median_of(runs, lambda: serve(q.rows, s.last_index, k))
                        row(f"serve a delta of {k:,} entries", d * 1e3, r * 1e3, "ms", "{:,.2f}")
                    q.close()
    print("d/sqlite: for entries/s above 1 means dpeer is faster; for ms below 1 means dpeer is faster.")


if __name__ == "__main__":
    main()
