"""MemberRecordSync's update round on the virtual clock: a seed that holds the request does not
stop the others, a seed that refused is tried again (the start-up race of the hung-worker test:
a refused seed, then 5 s waited on a peer that knew no leader), a known leader is asked alone,
a refusal told again and again stops the daemon with its sentence, and each boot sends one
update though its record is current (the leader judges it: a copy of a member's disk)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from dpeer import errors
from dpeer.consensus import Role
from dpeer.daemon.node import record_sync
from dpeer.daemon.node.record_sync import MemberRecordSync
from dpeer.transport.calls import JoinReply
from tests.house.loop import VirtualLoop


class _Node:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.id, self.addr, self.role, self.leader_id, self.addrs = "n2", "127.0.0.1:2", Role.FOLLOWER, None, {}
        self.reads = SimpleNamespace(uid="0" * 32, state=SimpleNamespace(members={}))
        self.timers = self
        self.clock, self.admitted_by, self.seeds, self.nudged = loop.time, None, [], 0
        self.stopped, self.boot, self.started = False, "b" * 16, -2.5

    def join_seeds(self, addrs: list[str]) -> None:
        self.seeds = addrs

    def chores_now(self) -> None:
        self.nudged += 1

    def stop(self) -> None:
        self.stopped = True


def _box(site: str = "") -> SimpleNamespace:
    """This box as its record should say it: store port 7, ready, `site` configured."""
    return SimpleNamespace(leaving=False, store_port=lambda: 7, ready=lambda: True, site=lambda: (site, ()),
                           speed_class=lambda: None)


class _Transport:
    """Per address: ("refuse_until", t) refuses before t, then accepts; ("hold",) holds every request
    until its timeout; ("slow", d) accepts after d seconds (a leader committing slowly); ("deny", s)
    refuses every request with the sentence s (BadRequest); ("busy",) answers Unavailable."""

    def __init__(self, loop: asyncio.AbstractEventLoop, peers: dict[str, tuple]) -> None:
        self.loop, self.peers, self.calls = loop, peers, []

    def client(self, addr: str, timeout: float) -> SimpleNamespace:
        async def join(*args: object) -> JoinReply:
            self.calls.append((round(self.loop.time(), 3), addr))
            self.sent = args
            how = self.peers[addr]
            if how[0] == "deny":
                raise errors.BadRequest(how[1])
            if how[0] == "busy":
                raise errors.Unavailable("the leader cannot tell yet")
            if how[0] == "hold":
                await asyncio.sleep(timeout)
                raise errors.Unreachable(f"{addr}: deadline exceeded")
            if how[0] == "slow":
                await asyncio.sleep(how[1])
            elif self.loop.time() < how[1]:
                raise errors.Unreachable(f"{addr}: connection refused")
            return JoinReply(accepted=True, leader_id="n1")
        return SimpleNamespace(join=join)


def _round(peers: dict[str, tuple], leader: str | None = None) -> tuple[_Node, _Transport, float]:
    loop = VirtualLoop()
    try:
        node, transport = _Node(loop), _Transport(loop, peers)
        if leader is not None:
            node.leader_id, node.addrs = leader, {leader: leader}
        sync = MemberRecordSync(node, transport, [a for a in peers if a != leader], _box())

        async def main() -> float:
            sync(loop.time())
            await sync.task
            return loop.time()
        return node, transport, loop.run_until_complete(main())
    finally:
        loop.close()


def test_a_refused_seed_is_tried_again_while_another_holds_the_request() -> None:
    node, transport, took = _round({"n1": ("refuse_until", 0.3), "n3": ("hold",)})
    assert node.admitted_by == "n1" and node.nudged == 1
    assert transport.calls[:2] == [(0.0, "n1"), (0.0, "n3")]
    assert transport.calls[-1] == (record_sync.JOIN_RETRY, "n1")
    assert took == record_sync.JOIN_RETRY  # not the 5 s the held request would have cost


def test_a_seed_that_holds_the_request_does_not_hold_up_the_next() -> None:
    node, transport, took = _round({"n3": ("hold",), "n1": ("refuse_until", 0.0)})
    assert transport.calls == [(0.0, "n3"), (record_sync.HEDGE, "n1")] and node.admitted_by == "n1"
    assert took == record_sync.HEDGE


def test_a_known_leader_is_asked_alone_while_it_commits() -> None:
    node, transport, took = _round({"L": ("slow", 0.6), "n3": ("refuse_until", 0.0)}, leader="L")
    assert transport.calls == [(0.0, "L")], "a follower would forward a second request to the same leader"
    assert took == 0.6 and node.admitted_by == "n1"


def test_a_round_that_finds_no_one_ends_within_its_bound() -> None:
    node, transport, took = _round({"n1": ("refuse_until", 1e9), "n3": ("hold",)})
    assert node.admitted_by is None and node.nudged == 0
    assert took <= record_sync.ROUND + 1e-9
    assert [a for _, a in transport.calls].count("n3") == 1  # never two requests to one address at once
    assert [a for _, a in transport.calls].count("n1") >= record_sync.ROUND / record_sync.JOIN_RETRY - 1


HELD = "node id n2 is held by a live member at 127.0.0.1:9 (store 3fa2b0c1); give this box another --node-id, ..."


def _rounds(peers: dict[str, tuple], rounds: int) -> tuple[_Node, MemberRecordSync, _Transport]:
    """Run `rounds` update rounds back to back (each as the daemon's chores would start it)."""
    loop = VirtualLoop()
    try:
        node, transport = _Node(loop), _Transport(loop, peers)
        sync = MemberRecordSync(node, transport, list(peers), _box())

        async def main() -> None:
            for _ in range(rounds):
                await asyncio.sleep(record_sync.JOIN_RETRY)
                sync(loop.time())
                if sync.task is not None:
                    await sync.task
        loop.run_until_complete(main())
        return node, sync, transport
    finally:
        loop.close()


def test_a_refusal_told_again_and_again_stops_the_daemon_with_its_sentence() -> None:
    node, sync, transport = _rounds({"n1": ("deny", HELD)}, rounds=6)
    assert sync.refusal == HELD and node.stopped
    assert len(transport.calls) == record_sync.REFUSALS_TO_STOP  # and no update after it stopped


def test_a_leader_that_cannot_tell_yet_is_asked_again_without_stopping() -> None:
    node, sync, transport = _rounds({"n1": ("busy",)}, rounds=2)
    assert sync.refusal is None and not node.stopped
    assert len(transport.calls) > record_sync.REFUSALS_TO_STOP


def test_refusals_that_differ_do_not_add_up() -> None:
    loop = VirtualLoop()
    node = _Node(loop)
    sync = MemberRecordSync(node, _Transport(loop, {}), [], _box())
    loop.close()
    for sentence in ("held at a", "held at b", "held at a", "held at b"):
        assert not sync._stop_on(sentence)
    assert not node.stopped and sync.refusal is None


def test_each_boot_sends_one_update_though_its_record_is_current_and_tells_its_boot_and_age() -> None:
    loop = VirtualLoop()
    try:
        node, transport = _Node(loop), _Transport(loop, {"n1": ("refuse_until", 0.0)})
        sync = MemberRecordSync(node, transport, ["n1"], _box("lab-2"))
        node.reads.state.members["n2"] = SimpleNamespace(status="active", addr=node.addr, store_port=7, ready=True,
                                                         uid=node.reads.uid, site="lab-2", near=(),
                                                         speed_class=None)

        async def main() -> None:
            for _ in range(3):
                sync(loop.time())
                if sync.task is not None:
                    await sync.task
                await asyncio.sleep(record_sync.JOIN_RETRY)
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert len(transport.calls) == 1 and sync.confirmed
    assert transport.sent == ("n2", node.addr, 7, True, node.reads.uid, "b" * 16, 2.5, "lab-2", (), None)


def test_a_new_speed_class_is_sent_and_a_record_that_carries_it_sends_nothing_more() -> None:
    loop = VirtualLoop()
    try:
        node, transport = _Node(loop), _Transport(loop, {"n1": ("refuse_until", 0.0)})
        box = _box()
        sync = MemberRecordSync(node, transport, ["n1"], box)
        record = SimpleNamespace(status="active", addr=node.addr, store_port=7, ready=True, uid=node.reads.uid,
                                 site="", near=(), speed_class=None)
        node.reads.state.members["n2"] = record

        async def a_pass() -> None:
            sync(loop.time())
            if sync.task is not None:
                await sync.task
            await asyncio.sleep(record_sync.JOIN_RETRY)

        loop.run_until_complete(a_pass())  # this boot's first update, record current
        box.speed_class = lambda: 12  # the worker reported its speed: class 12
        loop.run_until_complete(a_pass())
        assert transport.sent[-1] == 12 and len(transport.calls) == 2
        record.speed_class = 12  # committed
        loop.run_until_complete(a_pass())
    finally:
        loop.close()
    assert len(transport.calls) == 2
