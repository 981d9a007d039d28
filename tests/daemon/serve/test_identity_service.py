"""The leader's join path over a real Node and store: what the node hears (each message's store uid
and boot) and who answers at the record's address decide whether a join under a node id another
store or process holds is refused, with its sentence, or admitted; a node refuses the messages of
a copy of a member's disk; and the leader's status counts the voters that answer (fault_tolerance)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest

from dpeer.consensus import Peer, Role, bootstrap
from dpeer.daemon.node.driver import Node
from dpeer.daemon.serve.backing import Backing
from dpeer.daemon.serve.service import Service
from dpeer.daemon.serve.status import tolerance
from dpeer.daemon.node.storage_adapter import StoreStorage
from dpeer.errors import BadRequest, Unreachable
from dpeer.membership.messages import Gossip, Heartbeat
from dpeer.statemachine.store import Store
from dpeer.transport.api import Envelope
from dpeer.transport.calls import JoinRequest, StatusReply
from tests.support.clocks import ManualClock

OLD, NEW = "a" * 32, "b" * 32
HOME, AWAY = "127.0.0.1:7101", "127.0.0.1:7109"
ORIG, COPY = "1" * 16, "2" * 16  # n1's boots: its process, and a copy of its disk (or its restart)
HELD = ("node id n1 is held by a live member at 127.0.0.1:7101 (store aaaaaaaa); give this box another --node-id, "
        "or stop that one and wait until gossip holds it dead")
COPY_HELD = ("node id n1 and its store aaaaaaaa are held by another live process at 127.0.0.1:7101 (boot 11111111, "
             "started before this one); this box runs a copy of its disk: give it a fresh data dir and another "
             "--node-id")


class Answers:
    """The transport's status calls: who answers at each address (node id, store uid, boot, age),
    a refused connection where nobody does; each call noted."""

    def __init__(self) -> None:
        self.at: dict[str, tuple[str, str, str, float]] = {}
        self.asked: list[str] = []

    def client(self, addr: str, timeout: float) -> SimpleNamespace:
        async def status() -> StatusReply:
            self.asked.append(addr)
            if addr not in self.at:
                raise Unreachable(f"node {addr} refused the connection", refused=True)
            node_id, uid, boot, up = self.at[addr]
            return StatusReply(json=json.dumps({"node_id": node_id, "uid": uid, "boot": boot, "uptime_s": up}))
        return SimpleNamespace(status=status)


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[tuple[Node, Service, ManualClock]]:
    """n0, sole voter and leader, with n1 a member under store OLD at HOME (an older peer: no boot)."""
    clock = ManualClock()
    store = Store.open(tmp_path / "s", node_id="n0")
    bootstrap(StoreStorage(store), ["n0"], uids={"n0": store.uid})
    node = Node("n0", "127.0.0.1:7100", store, lambda *a: None, clock=clock)
    try:
        while node.role is not Role.LEADER:
            clock.advance(0.5)
            node.timers.step()
        backing = Backing(SimpleNamespace(status=dict), SimpleNamespace(group_failed=lambda *a: None,  # type: ignore[arg-type]
                          checkpoint_reported=lambda *a: 0), SimpleNamespace(left=_never), tmp_path / "ckpt")
        service = Service(node, Answers(), backing)  # type: ignore[arg-type]
        asyncio.run(service.join(_join(HOME, OLD)))
        yield node, service, clock
    finally:
        store.close()


async def _never() -> None:
    raise AssertionError("nobody leaves here")


def _join(addr: str, uid: str, boot: str = "", up: float = 0.0) -> JoinRequest:
    return JoinRequest(node_id="n1", addr=addr, store_port=0, ready=True, uid=uid, boot=boot, up=up)


def _hear(node: Node, clock: ManualClock, uid: str, addr: str, boot: str = "", up: float = 0.0) -> None:
    """A gossip message from n1 under store `uid` (and boot, up that long) arrives, then a little time passes."""
    hb = Heartbeat("n1", addr, 0, 0, 0, 0, clock.now())
    node.deliver(Envelope(Gossip(hb, ()), Peer("n1", uid, 1), addr, boot=boot, up=up))
    clock.advance(0.2)


def _answering(service: Service, addr: str, uid: str, boot: str = "", up: float = 1.0) -> Answers:
    answers = service.transport
    assert isinstance(answers, Answers)
    answers.at[addr] = ("n1", uid, boot, up)
    return answers


def test_a_join_under_an_id_whose_holder_answers_is_refused_with_its_sentence(leader) -> None:
    node, service, clock = leader
    _hear(node, clock, NEW, AWAY)  # the duplicate appears (its gossip)...
    _hear(node, clock, OLD, HOME)  # ...and the holder answers after it
    with pytest.raises(BadRequest) as refused:
        asyncio.run(service.join(_join(AWAY, NEW)))
    assert str(refused.value) == HELD
    assert node.store.state.members["n1"].uid == OLD


def test_a_box_back_on_a_new_disk_at_its_address_is_admitted_at_once(leader) -> None:
    node, service, clock = leader
    _hear(node, clock, OLD, HOME)  # the old process, before it died
    _hear(node, clock, NEW, HOME)  # the new one, on a wiped disk, at the same address
    answers = _answering(service, HOME, NEW)  # asked, the new store answers there
    asyncio.run(service.join(_join(HOME, NEW)))
    assert node.store.state.members["n1"].uid == NEW and answers.asked == [HOME]


def test_a_clone_advertising_the_holders_address_is_refused_by_who_answers_there(leader) -> None:
    """The clone's config says `advertise: HOME`; it runs elsewhere, and the holder answers at HOME."""
    node, service, clock = leader
    _hear(node, clock, OLD, HOME)  # the holder, before the clone appeared
    _hear(node, clock, NEW, HOME)  # the clone, claiming HOME
    answers = _answering(service, HOME, OLD)
    with pytest.raises(BadRequest) as refused:
        asyncio.run(service.join(_join(HOME, NEW)))
    assert str(refused.value) == HELD and answers.asked == [HOME]
    assert node.store.state.members["n1"].uid == OLD


def test_a_copy_of_a_members_whole_disk_is_refused_though_its_record_is_current(leader) -> None:
    """The copy runs on the original's store (same uid) and advertises its address, so its record
    reads as the original's: its boot's first join is judged all the same."""
    node, service, clock = leader
    _hear(node, clock, OLD, HOME, ORIG, 100.0)
    answers = _answering(service, HOME, OLD, ORIG, 100.4)
    with pytest.raises(BadRequest) as refused:
        asyncio.run(service.join(_join(HOME, OLD, COPY, 0.1)))  # started after the original was last heard
    assert str(refused.value) == COPY_HELD and answers.asked == [HOME]
    assert node.store.state.members["n1"].addr == HOME


def test_a_restart_on_its_own_disk_is_admitted_at_once(leader) -> None:
    node, service, clock = leader
    _hear(node, clock, OLD, HOME, ORIG, 100.0)  # the old process, before it died
    clock.advance(1.0)
    _hear(node, clock, OLD, HOME, COPY, 0.1)  # the new one
    answers = _answering(service, HOME, OLD, COPY, 0.3)
    asyncio.run(service.join(_join(HOME, OLD, COPY, 0.3)))
    assert answers.asked == [HOME] and node.store.state.members["n1"].uid == OLD


def test_a_node_refuses_the_messages_of_a_copy_and_keeps_the_originals(leader) -> None:
    node, _, clock = leader
    _hear(node, clock, OLD, HOME, ORIG, 100.0)
    _hear(node, clock, OLD, AWAY, COPY, 0.1)  # the copy starts: nothing tells yet that the original lives
    _hear(node, clock, OLD, HOME, ORIG, 100.4)  # the original, heard since
    with pytest.raises(BadRequest) as refused:
        _hear(node, clock, OLD, AWAY, COPY, 0.5)
    assert str(refused.value) == COPY_HELD
    _hear(node, clock, OLD, HOME, ORIG, 100.8)


def test_a_restart_is_no_copy_to_a_node(leader) -> None:
    node, _, clock = leader
    _hear(node, clock, OLD, HOME, ORIG, 100.0)
    clock.advance(1.0)
    for up in (0.1, 0.3, 0.5):
        _hear(node, clock, OLD, HOME, COPY, up)


def test_a_join_forwarded_late_from_a_dead_process_does_not_make_its_restart_a_copy(leader) -> None:
    """A peer held n1's join while no leader was known and forwards it once one is: the process
    that sent it (ORIG, 4 s old then) died meanwhile and n1 restarted (COPY). The leader, itself
    restarted, never heard ORIG: the late join is refused (COPY answers at HOME) and COPY's
    messages are not refused as a copy's (found by the house simulation, seed 929)."""
    node, service, clock = leader
    _hear(node, clock, OLD, HOME, COPY, 0.1)  # the restarted process, heard by its gossip
    answers = _answering(service, HOME, OLD, COPY, 0.3)
    with pytest.raises(BadRequest):
        asyncio.run(service.join(_join(HOME, OLD, ORIG, 4.0)))  # the dead process's join, forwarded late
    assert answers.asked == [HOME]
    for up in (0.5, 0.7):
        _hear(node, clock, OLD, HOME, COPY, up)  # not refused: no live process started before it


def test_the_leaders_status_counts_a_voter_two_processes_answer_for_as_unheld(tmp_path: Path) -> None:
    clock = ManualClock()
    store = Store.open(tmp_path / "s", node_id="n0")
    try:
        bootstrap(StoreStorage(store), ["n0"], uids={"n0": store.uid})
        node = Node("n0", "127.0.0.1:7100", store, lambda *a: None, clock=clock)
        while node.role is not Role.LEADER:
            clock.advance(0.5)
            node.timers.step()
        clone = Peer("n0", store.uid, 1)  # a copy of the leader's own disk, started after it
        hb = Heartbeat("n0", AWAY, 0, 0, 0, 0, clock.now())
        with pytest.raises(BadRequest):
            node.deliver(Envelope(Gossip(hb, ()), clone, AWAY, boot=COPY, up=0.1))
        assert tolerance(node) == {"voters": 1, "live_voters": 0, "can_lose": 0, "unheld": ["n0"]}
    finally:
        store.close()


def test_the_leaders_status_counts_the_voters_that_answer(leader) -> None:
    node, _, _ = leader
    assert tolerance(node) == {"voters": 1, "live_voters": 1, "can_lose": 0, "unheld": []}


@pytest.mark.parametrize("boot, up, sentence", [
    ("XYZ", 1.0, "boot must be the joining daemon's boot, 16 lowercase hex digits"),
    (COPY, float("nan"), "up must be the joining daemon's age in seconds, 0 to 1e+10"),
    (COPY, -1.0, "up must be the joining daemon's age in seconds, 0 to 1e+10"),
])
def test_a_join_with_a_bad_boot_or_age_is_refused_with_its_sentence(leader, boot, up, sentence) -> None:
    _, service, _ = leader
    with pytest.raises(BadRequest) as refused:
        asyncio.run(service.join(_join(HOME, OLD, boot, up)))
    assert str(refused.value) == sentence


@pytest.mark.parametrize("speed_class", [-81, 81, 1000])
def test_a_join_with_a_speed_class_out_of_range_is_refused_with_its_sentence(leader, speed_class) -> None:
    _, service, _ = leader
    with pytest.raises(BadRequest) as refused:
        asyncio.run(service.join(replace(_join(HOME, OLD), speed_class=speed_class)))
    assert str(refused.value) == f"speed_class {speed_class} is not a speed class: -80 to 80, or unset while unknown"


def test_a_join_s_speed_class_reaches_the_committed_record_and_unset_is_unknown(leader) -> None:
    node, service, _ = leader
    assert node.reads.state.members["n1"].speed_class is None
    asyncio.run(service.join(replace(_join(HOME, OLD), speed_class=-3)))
    assert node.reads.state.members["n1"].speed_class == -3
