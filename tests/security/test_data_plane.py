"""Issue 35, finding 1, replayed against a secured 2-box cluster training the demo job: a stranger
on the rendezvous store port (shown in `dpeer status` to read-only clients) tries torch's own store
client, the write that once stalled training for good (`sealed` = abandoned on every generation
near the current one), values of 8 MiB and a flood of idle connections, while the group trains and
while it re-forms after a worker is killed. Training goes on, every request is refused, and the
worker's memory stays bounded."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import threading
import time
from pathlib import Path

import torch.distributed as dist

from dpeer.trainer import rendezvous_wire as wire
from tests.support.daemons import WAIT, formed, wait_status
from tests.support.pki import Pki


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


class StoreStranger(threading.Thread):
    """Plays finding 1 against host:port until stopped; counts what the store refused and whether
    anything was ever answered as if the stranger held a generation's key."""

    def __init__(self, host: str, port: int, generation: int) -> None:
        super().__init__(daemon=True)
        self.addr, self.generation = (host, port), generation
        self.stop, self.refused, self.answered, self.flood = threading.Event(), 0, 0, []
        self.error: BaseException | None = None

    def attempt(self, frames: list[bytes] | None, raw: bytes = b"") -> None:
        try:
            with socket.create_connection(self.addr, timeout=2) as s:
                nonce = wire.read_greeting(s.recv(wire.GREETING_BYTES))
                s.sendall(raw or b"".join(f(nonce) for f in frames or []))  # type: ignore[operator]
                s.settimeout(5)
                reply = s.recv(4096)
        except (OSError, wire.WireError):
            self.refused += 1
            return
        if reply == b"":
            self.refused += 1
        elif wire.split(reply[wire.LEN_BYTES:wire.LEN_BYTES + wire.frame_length(reply[:wire.LEN_BYTES])])[2][1] != "unknown":
            self.answered += 1  # the first answer: a generation the store does not host says only "unknown"

    def run(self) -> None:
        try:
            self._attack()
        except BaseException as exc:  # noqa: BLE001 - the test asserts the attack ran throughout
            self.error = exc

    def _attack(self) -> None:
        key = os.urandom(32)
        while not self.stop.is_set():
            for gen in range(self.generation, self.generation + 4):
                self.attempt([lambda n, g=gen: wire.frame(key, b"q", n, [g, 1, "compare_set", ["sealed", b"", b"abandoned"]]),
                              lambda n, g=gen: wire.frame(key, b"q", n, [g, 2, "get", ["0/0"]])])
            self.attempt(None, raw=(8 << 20).to_bytes(4, "big") + os.urandom(64 << 10))  # an 8 MiB value
            if len(self.flood) < 300:
                try:
                    self.flood.append(socket.create_connection(self.addr, timeout=2))
                except OSError:
                    pass
            time.sleep(0.01)
        for s in self.flood:
            s.close()


def test_a_stranger_on_the_store_port_does_not_stop_a_secured_cluster(daemons, pki: Pki) -> None:
    training = {"training": {"steps": 100000, "checkpoint_every": 0}}
    n1 = daemons.start("n1", config=pki.config("n1", "node-n1", extra=training), extra=["--job", "demo"])
    n2 = daemons.start("n2", config=pki.config("n2", "node-n2", extra=training), extra=["--job", "demo"],
                       join=[n1.addr])
    reader = pki.security("client-bob")  # a read-only client sees the store's address
    formed(n1.addr, {"n1", "n2"}, security=reader)
    doc = wait_status(n1.addr, lambda d: (d.get("group") or {}).get("world_size") == 2 and (d["train"] or {}).get(
        "step", 0) >= 20, "two boxes training", security=reader)
    host, port = doc["group"]["store_host"].rsplit(":", 1)
    rank0 = {"n1": n1, "n2": n2}[doc["group"]["members"][0]]
    host_pid = wait_status(rank0.addr, lambda d: d["worker"]["pid"], "rank 0's worker", security=reader)["worker"]["pid"]
    other = n2 if rank0 is n1 else n1
    rss_before = rss_kb(host_pid)

    stranger = StoreStranger(host, int(port), doc["group"]["generation"])
    stranger.start()
    try:
        try:
            dist.TCPStore(host, int(port), is_master=False, timeout=dt.timedelta(seconds=3))
            raise AssertionError("torch's store client (list, read, set, compare_set, delete) was served")
        except (RuntimeError, ValueError):
            pass
        step = wait_status(n1.addr, lambda d: d["train"]["step"], "a step", security=reader)["train"]["step"]
        wait_status(n1.addr, lambda d: d["train"]["step"] >= step + 50, "training to go on under the stranger",
                    security=reader)
        # a re-form while the stranger writes `sealed` into every generation near the current one
        worker = wait_status(other.addr, lambda d: d["worker"]["pid"], "the other worker", security=reader)
        os.kill(worker["worker"]["pid"], signal.SIGKILL)
        gen = doc["group"]["generation"]
        wait_status(n1.addr, lambda d: (d.get("group") or {}).get("generation", 0) > gen
                    and d["group"]["world_size"] == 2 and (d["train"] or {}).get("step", 0) > step + 60,
                    "both boxes training again after the kill", timeout=WAIT * 2, security=reader)
        job = wait_status(n1.addr, lambda d: d["job"], "the job", security=reader)["job"]
        assert job["state"] == "training", job
    finally:
        stranger.stop.set()
        stranger.join(30)
    assert stranger.error is None, stranger.error
    assert stranger.refused >= 20 and stranger.answered == 0, (stranger.refused, stranger.answered)
    grown = rss_kb(host_pid) - rss_before
    assert grown < 64 << 10, f"rank 0's worker grew by {grown} KiB under the stranger"
