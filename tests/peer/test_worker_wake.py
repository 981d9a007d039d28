"""The worker's doorbell and exit watch wake the daemon's loop; progress reports do not."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from dpeer.channel.local import DirViewSource, Doorbell
from dpeer.daemon.worker_wake import WorkerWake


def test_urgent_reports_ring_the_doorbell_and_progress_does_not(tmp_path: Path) -> None:
    bell = Doorbell(str(tmp_path))
    try:
        source = DirViewSource(str(tmp_path), "n1")
        source.report_progress(1, 64, 0.5, "")
        assert bell.drain() == 0
        source.report_failure("peer reset", 3)
        source.report_event("joined", generation=3)
        assert bell.drain() == 2
    finally:
        bell.close()


def test_a_report_without_a_daemon_listening_is_still_written(tmp_path: Path) -> None:
    source = DirViewSource(str(tmp_path), "n1")
    source.report_failure("peer reset", 1)
    assert (tmp_path / "reports" / "n1.jsonl").read_text().count('"failure"') == 1


def test_a_second_doorbell_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    bell = Doorbell(str(tmp_path))
    try:
        with pytest.raises(OSError):
            Doorbell(str(tmp_path))
    finally:
        bell.close()


def test_worker_wake_calls_back_on_a_ring_and_on_the_workers_exit(tmp_path: Path) -> None:
    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        woken: list[str] = []
        event = asyncio.Event()

        def on_wake() -> None:
            woken.append("wake")
            event.set()

        wake = WorkerWake.start(loop, str(tmp_path), on_wake, on_wake)
        assert wake is not None
        try:
            DirViewSource(str(tmp_path), "n1").report_failure("x", 1)
            await asyncio.wait_for(event.wait(), 10)
            event.clear()
            proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
            wake.watch_exit(proc.pid)
            await asyncio.sleep(0.2)
            assert woken == ["wake"]  # still running: no wake
            proc.stdin.close()
            await asyncio.wait_for(event.wait(), 30)
            proc.wait(timeout=30)
            second = WorkerWake.start(loop, str(tmp_path), on_wake, on_wake)
            assert second is None  # this directory's doorbell is taken
        finally:
            wake.close()
            wake.close()
        return woken

    assert asyncio.run(scenario()) == ["wake", "wake"]
