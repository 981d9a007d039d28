"""A daemon whose data dir's filesystem fills up stops and says why: the write the disk refused
was rolled back, the node sent nothing after it (fail-stop: its memory was ahead of its disk),
the process exits 1 with one sentence naming the store, the free space and what to do; started
again on the still full disk it stops again the same way, and once there is room it serves every
value committed before."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from dpeer import errors
from dpeer.transport.client import NodeClient
from dpeer.transport.options import Security
from tests.support.trainer_cluster import free_ports

SOURCE = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def start(data_dir: Path, addr: str, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPEER_")}
    env["PYTHONPATH"] = str(SOURCE)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "dpeer.cli.main", "start", "--node-id", "n1", "--listen", addr,
                                 "--data-dir", str(data_dir)], stdout=subprocess.DEVNULL, stderr=out, env=env)


async def fill(addr: str, proc: subprocess.Popen) -> list[str]:
    """Put 60 kB values until the daemon stops answering; the keys it committed."""
    committed: list[str] = []
    async with NodeClient(addr, Security(), timeout=10.0) as client:
        for _ in range(60):  # a ready daemon first
            try:
                await client.status()
                break
            except errors.PeerError:
                await asyncio.sleep(0.5)
        for i in range(200):
            if proc.poll() is not None:
                break
            try:
                await client.kv_put(f"k{i}", f"{i}:" + "x" * 60_000, timeout=10.0)
            except errors.PeerError:
                break
            committed.append(f"k{i}")
    return committed


async def read_back(addr: str, keys: list[str]) -> dict[str, str]:
    async with NodeClient(addr, Security(), timeout=10.0) as client:
        for _ in range(60):
            try:
                await client.status()
                break
            except errors.PeerError:
                await asyncio.sleep(0.5)
        return {k: (await client.kv_get(k)).value for k in keys}


def test_a_full_disk_stops_the_daemon_with_its_reason_and_loses_no_committed_value(small_disk: Path,
                                                                                  tmp_path: Path) -> None:
    addr = f"127.0.0.1:{free_ports(1)[0]}"
    log = tmp_path / "n1.log"
    proc = start(small_disk / "n1", addr, log)
    try:
        committed = asyncio.run(fill(addr, proc))
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert code == 1, text[-3000:]  # a store that fails while running (operations.md, exit codes)
    assert len(committed) > 5, text[-3000:]
    last = [line for line in text.splitlines() if line.startswith("dpeer: ")]
    assert last and "cannot write the state store" in last[-1] and "KiB free" in last[-1], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    full = start(small_disk / "n1", addr, tmp_path / "n1-full.log")  # started again on the full disk
    assert full.wait(timeout=120) == 1  # stops again, saying why: no loop that writes nothing
    assert "cannot write the state store" in (tmp_path / "n1-full.log").read_text()
    subprocess.run(["mount", "-o", "remount,size=32m", str(small_disk)], check=True)  # the operator frees space
    again = start(small_disk / "n1", addr, tmp_path / "n1-again.log")
    try:
        values = asyncio.run(read_back(addr, committed))
    finally:
        again.terminate()
        again.wait(timeout=60)
    assert all(values[k].startswith(f"{k[1:]}:") for k in committed)
