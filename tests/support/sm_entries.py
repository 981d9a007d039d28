"""Shared builders for the state machine tests (also imported by the crash child)."""

from __future__ import annotations

from dpeer.statemachine.entry import Entry, EntryKind

KEYS = 37


def expected_entry(index: int) -> Entry:
    """The deterministic entry the crash child writes at `index`."""
    return Entry(index, 1 + index // 500, EntryKind.KV_PUT,
                 {"key": f"k{index % KEYS}", "value": f"v{index}"})


def expected_kv(applied: int) -> dict[str, str]:
    """The kv map after applying expected_entry(1..applied)."""
    out = {}
    for j in range(KEYS):
        last = applied - ((applied - j) % KEYS)
        if last >= 1:
            out[f"k{j}"] = f"v{last}"
    return out


def kv_entries(lo: int, hi: int, term: int = 1) -> list[Entry]:
    """kv_put entries [lo, hi) in one term."""
    return [Entry(i, term, EntryKind.KV_PUT, {"key": f"k{i % 7}", "value": f"v{i}"})
            for i in range(lo, hi)]
