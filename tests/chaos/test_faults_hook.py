"""The test-only fault injection hook (dpeer/transport/faults.py): inert without its file,
re-read when the file changes, and consulted by PeerSender.send."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path

from dpeer.transport.client import Channels, PeerSender
from dpeer.transport.faults import FaultHook, Faults, write_faults
from dpeer.transport.options import Security
from dpeer.proto.v1 import dpeer_pb2 as pb


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


def test_peer_sender_drops_what_the_hook_drops(tmp_path: Path) -> None:
    write_faults(tmp_path, drop=["127.0.0.1:1"])

    async def go() -> int:
        sender = PeerSender(Channels(Security()), on_refused=lambda a: None, faults=FaultHook.for_data_dir(tmp_path))
        for _ in range(5):
            sender.send("127.0.0.1:1", pb.Envelope())
        dropped = sender.dropped
        await sender.close()
        return dropped

    assert asyncio.run(go()) == 5
