"""A disk that fills up under the store: the write it refuses is rolled back and named
(StoreWriteFailed, with the OS's reason and what to do), every later write is refused too (the
owner must stop: its memory may be ahead of its disk), and reopened (on the same full disk) the store
holds every entry written before, and nothing else. A real filesystem: a small tmpfs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.errors import StoreWriteFailed
from dpeer.statemachine.store import Store


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for the test (root only)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def big(index: int) -> Entry:
    return Entry(index, 1, EntryKind.KV_PUT, {"key": f"k{index}", "value": "x" * 60_000})


def test_a_full_disk_fails_the_write_and_every_later_one_and_loses_nothing_written(small_disk: Path) -> None:
    store = Store.open(small_disk / "store", node_id="n1")
    written = 0
    with pytest.raises(StoreWriteFailed) as failed:
        for index in range(1, 200):
            store.append([big(index)])
            written = index
    # LMDB reports the full disk as an I/O error at commit; the message says what the disk has left
    assert re.search(r"its filesystem has \d+ KiB free", str(failed.value)) and "free space on" in str(failed.value)
    assert written > 3 and store.last_index == written  # the refused append changed nothing in memory
    with pytest.raises(StoreWriteFailed):
        store.set_hard_state(2, "n1")  # a tiny write that would fit: refused all the same
    assert store.current_term == 0
    store.close()
    again = Store.open(small_disk / "store", node_id="n1")
    try:
        assert again.last_index == written
        assert [e.payload["key"] for e in again.entries(1, written + 1)] == [f"k{i}" for i in range(1, written + 1)]
    finally:
        again.close()


def test_a_new_store_on_a_disk_with_no_room_is_refused_not_killed_by_sigbus(small_disk: Path) -> None:
    """LMDB writes its lock file through a memory map: on a disk with no room left, a new store
    would die of SIGBUS, saying nothing. The lock file is allocated first, and refused with a reason."""
    with open(small_disk / "filler", "wb") as filler:
        with pytest.raises(OSError):
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
    code = ("from pathlib import Path\nfrom dpeer.statemachine.store import Store\n"
            "from dpeer.statemachine.errors import StoreWriteFailed\n"
            f"try:\n    Store.open(Path({str(small_disk / 'store')!r}), node_id='n1')\n"
            "except StoreWriteFailed as exc:\n    print('REFUSED', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])  # -7 was SIGBUS
    assert out.stdout.startswith("REFUSED") and "lock file does not fit" in out.stdout, out.stdout
    assert not (small_disk / "store" / "lock.mdb").exists()
