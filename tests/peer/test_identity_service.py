"""The leader's join path over a real Node and store: what the node hears (each message's store uid)
decides whether a join under a node id another store holds is refused, with its sentence, or admitted;
and the leader's status counts the voters that answer (fault_tolerance)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Iterator

import pytest

from dpeer.consensus import Peer, Role, bootstrap
from dpeer.daemon.node import Node
from dpeer.daemon.service import Service
from dpeer.daemon.status import tolerance
from dpeer.daemon.storage_adapter import StoreStorage
from dpeer.errors import BadRequest
from dpeer.membership.messages import Gossip, Heartbeat
from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.statemachine.store import Store
from dpeer.transport import codec
from tests.support.clocks import ManualClock

OLD, NEW = "a" * 32, "b" * 32
HOME, AWAY = "127.0.0.1:7101", "127.0.0.1:7109"


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[tuple[Node, Service, ManualClock]]:
    """n0, sole voter and leader, with n1 a member under store OLD at HOME."""
    clock = ManualClock()
    store = Store.open(tmp_path / "s", node_id="n0")
    bootstrap(StoreStorage(store), ["n0"], uids={"n0": store.uid})
    node = Node("n0", "127.0.0.1:7100", store, lambda *a: None, clock=clock)
    try:
        while node.role is not Role.LEADER:
            clock.advance(0.5)
            node.step_timers()
        service = Service(node, None, dict, _never, lambda *a: None, lambda *a: 0,  # type: ignore[arg-type]
                          tmp_path / "ckpt")
        asyncio.run(service.join(_join(HOME, OLD)))
        yield node, service, clock
    finally:
        store.close()


async def _never() -> None:
    raise AssertionError("nobody leaves here")


def _join(addr: str, uid: str) -> pb.JoinRequest:
    return pb.JoinRequest(node_id="n1", addr=addr, store_port=0, ready=True, uid=uid)


def _hear(node: Node, clock: ManualClock, uid: str, addr: str) -> None:
    """A gossip message from n1 under store `uid` arrives, then a little time passes."""
    hb = Heartbeat("n1", addr, 0, 0, 0, 0, clock.now())
    node.deliver(codec.encode(Gossip(hb, ()), Peer("n1", uid, 1), addr))
    clock.advance(0.2)


def test_a_join_under_an_id_whose_holder_answers_is_refused_with_its_sentence(leader) -> None:
    node, service, clock = leader
    _hear(node, clock, NEW, AWAY)  # the duplicate appears (its gossip)...
    _hear(node, clock, OLD, HOME)  # ...and the holder answers after it
    with pytest.raises(BadRequest) as refused:
        asyncio.run(service.join(_join(AWAY, NEW)))
    assert str(refused.value) == ("node id n1 is held by a live member at 127.0.0.1:7101 (store aaaaaaaa); give this "
                                  "box another --node-id, or stop that one and wait until gossip holds it dead")
    assert node.store.state.members["n1"].uid == OLD


def test_a_box_back_on_a_new_disk_at_its_address_is_admitted_at_once(leader) -> None:
    node, service, clock = leader
    _hear(node, clock, OLD, HOME)  # the old process, before it died
    _hear(node, clock, NEW, HOME)  # the new one, on a wiped disk, at the same address
    asyncio.run(service.join(_join(HOME, NEW)))
    assert node.store.state.members["n1"].uid == NEW


def test_the_leaders_status_counts_the_voters_that_answer(leader) -> None:
    node, _, _ = leader
    assert tolerance(node) == {"voters": 1, "live_voters": 1, "can_lose": 0, "unheld": []}
