"""The chaos tool's fault policy (dpeer/chaos/faults.py): inert without its file, re-read when
the file changes, and applied by the FaultyTransport wrapper that only the chaos daemon installs."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path

from dpeer.chaos.faults import FaultHook, Faults, write_faults
from dpeer.consensus.messages import Peer
from dpeer.transport.api import Envelope
from dpeer.transport.faulty import FaultyTransport

ENVELOPE = Envelope(None, Peer("n1", "", 0), "127.0.0.1:9")  # the wrapper never looks inside


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_no_file_means_no_faults(tmp_path: Path) -> None:
    hook = FaultHook.for_data_dir(tmp_path)
    assert all(hook.verdict("127.0.0.1:9") == 0.0 for _ in range(100))


def test_drop_loss_delay_and_reload_on_change(tmp_path: Path) -> None:
    clock = Clock()
    hook = FaultHook(tmp_path / "faults.json", clock=clock, rng=random.Random(1))
    write_faults(tmp_path, drop=["127.0.0.1:2"], delay=0.05)
    assert hook.verdict("127.0.0.1:2") is None
    assert hook.verdict("127.0.0.1:3") == 0.05
    write_faults(tmp_path, loss=0.5)
    assert hook.verdict("127.0.0.1:2") is None  # not re-read before RECHECK
    clock.t += 1.0
    verdicts = [hook.verdict("127.0.0.1:2") for _ in range(1000)]
    assert 350 < verdicts.count(None) < 650 and set(verdicts) == {None, 0.0}
    os.remove(tmp_path / "faults.json")
    clock.t += 1.0
    assert hook.verdict("127.0.0.1:2") == 0.0


def test_a_bad_file_keeps_the_previous_faults(tmp_path: Path) -> None:
    clock = Clock()
    hook = FaultHook(tmp_path / "faults.json", clock=clock)
    write_faults(tmp_path, drop=["127.0.0.1:2"])
    assert hook.verdict("127.0.0.1:2") is None
    (tmp_path / "faults.json").write_text(json.dumps({"drop": "everything"}))
    clock.t += 1.0
    assert hook.verdict("127.0.0.1:2") is None
    assert Faults.parse({}) == Faults()


class Recording:
    """An inner transport that records what reaches it, and when."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, float]] = []
        self.closed = False

    def send(self, addr: str, envelope: Envelope) -> None:
        self.sent.append((addr, asyncio.get_running_loop().time()))

    def client(self, addr: str, timeout: float = 5.0, on_behalf_of: str | None = None) -> str:
        return f"client of {addr}"

    async def close(self) -> None:
        self.closed = True


def test_the_wrapper_drops_and_holds_what_the_hook_says(tmp_path: Path) -> None:
    write_faults(tmp_path, drop=["127.0.0.1:1"], delay=0.05)

    async def go() -> tuple[FaultyTransport, Recording, float]:
        inner = Recording()
        faulty = FaultyTransport(inner, FaultHook.for_data_dir(tmp_path).verdict)
        start = asyncio.get_running_loop().time()
        for _ in range(5):
            faulty.send("127.0.0.1:1", ENVELOPE)
        faulty.send("127.0.0.1:2", ENVELOPE)
        assert inner.sent == []  # held, not yet sent
        await asyncio.sleep(0.2)
        assert faulty.client("127.0.0.1:2") == "client of 127.0.0.1:2"
        await faulty.close()
        return faulty, inner, start

    faulty, inner, start = asyncio.run(go())
    assert (faulty.dropped, faulty.delayed) == (5, 1)
    assert [a for a, _ in inner.sent] == ["127.0.0.1:2"] and inner.sent[0][1] - start >= 0.05
    assert inner.closed


def test_dpeer_start_has_no_fault_hook() -> None:
    import inspect

    from dpeer.transport.client import PeerSender

    assert "faults" not in inspect.signature(PeerSender).parameters
    from dpeer.daemon import daemon

    source = inspect.getsource(daemon)
    assert "FaultHook" not in source and "faults.json" not in source
