"""The worker's doorbell and exit watch wake the daemon's loop; progress reports do not."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dpeer.channel.local import DirViewSource, Doorbell
from dpeer.daemon.worker.wake import WorkerWake


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


def private_dir(root: Path, *parts: str) -> Path:
    """A channel directory inside a 0700 data dir, as `dpeer start` makes them."""
    data = root.joinpath(*parts)
    data.mkdir(mode=0o700, parents=True)
    channel = data / "worker"
    channel.mkdir(mode=0o700)
    return channel


def test_the_doorbell_is_a_0600_socket_file_in_the_channel_directory(tmp_path: Path) -> None:
    channel = private_dir(tmp_path, "data")
    bell = Doorbell(str(channel))
    try:
        path = channel / "doorbell"
        assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert bell.path == str(path)
        inode = str(os.fstat(bell.fileno()).st_ino)
        rows = [line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:]]
        bound = [row[7] for row in rows if len(row) == 8 and row[6] == inode]
        assert bound == [str(path)], bound  # bound to the file, not to an abstract name any user could ring
    finally:
        bell.close()
    assert not (channel / "doorbell").exists(), "a closed doorbell removes its socket file"


def test_a_doorbell_left_by_a_killed_daemon_is_replaced_and_rings(tmp_path: Path) -> None:
    channel = private_dir(tmp_path, "data")
    code = ("import os, sys; from dpeer.channel.local import Doorbell; Doorbell(sys.argv[1]); "
            "os.kill(os.getpid(), 9)")
    subprocess.run([sys.executable, "-c", code, str(channel)], timeout=60)
    assert (channel / "doorbell").exists(), "a SIGKILLed daemon leaves its socket file"
    bell = Doorbell(str(channel))
    try:
        DirViewSource(str(channel), "n1").report_failure("peer reset", 1)
        assert bell.drain() == 1
    finally:
        bell.close()


def test_a_doorbell_deeper_than_a_unix_socket_path_allows_still_rings(tmp_path: Path) -> None:
    channel = private_dir(tmp_path, *(["a-rather-long-folder-name"] * 5))
    assert len(str(channel / "doorbell").encode()) > 108
    bell = Doorbell(str(channel))
    try:
        assert (channel / "doorbell").exists()
        DirViewSource(str(channel), "n1").report_event("joined", generation=1)
        assert bell.drain() == 1
        with pytest.raises(OSError):
            Doorbell(str(channel))  # live: refused, not replaced
    finally:
        bell.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to ring as another user")
def test_another_user_cannot_ring_the_doorbell(tmp_path: Path) -> None:
    """Issue 35: a user of the box flooded the abstract doorbell (672,542 datagrams in 5 s)."""
    channel = private_dir(tmp_path, "data")
    bell = Doorbell(str(channel))
    code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
            "try:\n    s.sendto(b'!', bytes.fromhex(sys.argv[1]))\nexcept PermissionError:\n    sys.exit(13)\n")
    with socket.socket(fileno=os.dup(bell.fileno())) as bound:
        name = bound.getsockname()  # where the daemon really listens
    address = (name if isinstance(name, bytes) else os.fsencode(name)).hex()

    def nobody() -> None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    try:
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        done = subprocess.run([python, "-c", code, address], preexec_fn=nobody, cwd="/",
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 13, (done.returncode, done.stderr)
        assert bell.drain() == 0
    finally:
        bell.close()
