"""A write the disk refuses stops the node: nothing leaves it afterwards, neither Raft nor SWIM
(its memory may be ahead of its disk, and a node that answers probes looks alive to its peers
while it can keep no promise)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from dpeer.consensus import Peer
from dpeer.consensus.storage import bootstrap
from dpeer.daemon.node.driver import Node
from dpeer.daemon.node.storage_adapter import StoreStorage
from dpeer.membership.messages import Heartbeat, Ping
from dpeer.statemachine.errors import StoreWriteFailed
from dpeer.statemachine.store import Store
from dpeer.transport.api import Envelope
from tests.support.clocks import ManualClock
from tests.support.failing_disk import failing

N2_UID = "ab" * 16


def test_a_node_whose_write_failed_sends_nothing_more_not_even_a_swim_ack(tmp_path: Path) -> None:
    clock = ManualClock()
    store = Store.open(tmp_path / "s", node_id="n1")
    bootstrap(StoreStorage(store), ["n1", "n2"], uids={"n1": store.uid, "n2": N2_UID})
    sent: list[tuple[str, Any]] = []
    node = Node("n1", "127.0.0.1:1", store, lambda addr, env: sent.append((addr, env.msg)), clock=clock)
    try:
        env = failing(store)
        env.failing = True
        with pytest.raises(StoreWriteFailed):
            for _ in range(200):  # until the election timeout: the campaign's term is refused
                clock.advance(0.1)
                node.tick(clock.now())
        assert node.write_failure is not None and node.timers.stopping
        sent.clear()
        hb = Heartbeat("n2", "127.0.0.1:2", 0, 0, 0, 0, clock.now())
        for call in (lambda: node.deliver(Envelope(Ping(7, "n1", hb), Peer("n2", N2_UID, 1), "127.0.0.1:2")),
                     lambda: node.refused("127.0.0.1:2"), lambda: node.join_seeds(["127.0.0.1:2"])):
            with contextlib.suppress(StoreWriteFailed):  # refused again, or nothing to write
                call()
        assert sent == [], f"a stopped node sent {sent}"
    finally:
        store.close()
