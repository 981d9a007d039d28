"""MemberRecordSync's update round on the virtual clock: a seed that holds the request does not
stop the others, a seed that refused is tried again (the start-up race of the hung-worker test:
a refused seed, then 5 s waited on a peer that knew no leader), and a known leader is asked alone."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from dpeer import errors
from dpeer.consensus import Role
from dpeer.daemon import member_record
from dpeer.daemon.member_record import MemberRecordSync
from dpeer.proto.v1 import dpeer_pb2 as pb
from tests.house.loop import VirtualLoop


class _Node:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.id, self.addr, self.role, self.leader_id, self.addrs = "n2", "127.0.0.1:2", Role.FOLLOWER, None, {}
        self.store = SimpleNamespace(uid="0" * 32, state=SimpleNamespace(members={}))
        self.clock, self.admitted_by, self.seeds, self.nudged = loop.time, None, [], 0

    def join_seeds(self, addrs: list[str]) -> None:
        self.seeds = addrs

    def chores_now(self) -> None:
        self.nudged += 1


class _Transport:
    """Per address: ("refuse_until", t) refuses before t, then accepts; ("hold",) holds every request
    until its timeout; ("slow", d) accepts after d seconds (a leader committing slowly)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, peers: dict[str, tuple]) -> None:
        self.loop, self.peers, self.calls = loop, peers, []

    def client(self, addr: str, timeout: float) -> SimpleNamespace:
        async def join(*_: object) -> pb.JoinReply:
            self.calls.append((round(self.loop.time(), 3), addr))
            how = self.peers[addr]
            if how[0] == "hold":
                await asyncio.sleep(timeout)
                raise errors.Unreachable(f"{addr}: deadline exceeded")
            if how[0] == "slow":
                await asyncio.sleep(how[1])
            elif self.loop.time() < how[1]:
                raise errors.Unreachable(f"{addr}: connection refused")
            return pb.JoinReply(accepted=True, leader_id="n1")
        return SimpleNamespace(join=join)


def _round(peers: dict[str, tuple], leader: str | None = None) -> tuple[_Node, _Transport, float]:
    loop = VirtualLoop()
    try:
        node, transport = _Node(loop), _Transport(loop, peers)
        if leader is not None:
            node.leader_id, node.addrs = leader, {leader: leader}
        sync = MemberRecordSync(node, transport, [a for a in peers if a != leader], lambda: 7, lambda: True)

        async def main() -> float:
            sync(loop.time(), leaving=False)
            await sync.task
            return loop.time()
        return node, transport, loop.run_until_complete(main())
    finally:
        loop.close()


def test_a_refused_seed_is_tried_again_while_another_holds_the_request() -> None:
    node, transport, took = _round({"n1": ("refuse_until", 0.3), "n3": ("hold",)})
    assert node.admitted_by == "n1" and node.nudged == 1
    assert transport.calls[:2] == [(0.0, "n1"), (0.0, "n3")]
    assert transport.calls[-1] == (member_record.JOIN_RETRY, "n1")
    assert took == member_record.JOIN_RETRY  # not the 5 s the held request would have cost


def test_a_seed_that_holds_the_request_does_not_hold_up_the_next() -> None:
    node, transport, took = _round({"n3": ("hold",), "n1": ("refuse_until", 0.0)})
    assert transport.calls == [(0.0, "n3"), (member_record.HEDGE, "n1")] and node.admitted_by == "n1"
    assert took == member_record.HEDGE


def test_a_known_leader_is_asked_alone_while_it_commits() -> None:
    node, transport, took = _round({"L": ("slow", 0.6), "n3": ("refuse_until", 0.0)}, leader="L")
    assert transport.calls == [(0.0, "L")], "a follower would forward a second request to the same leader"
    assert took == 0.6 and node.admitted_by == "n1"


def test_a_round_that_finds_no_one_ends_within_its_bound() -> None:
    node, transport, took = _round({"n1": ("refuse_until", 1e9), "n3": ("hold",)})
    assert node.admitted_by is None and node.nudged == 0
    assert took <= member_record.ROUND + 1e-9
    assert [a for _, a in transport.calls].count("n3") == 1  # never two requests to one address at once
    assert [a for _, a in transport.calls].count("n1") >= member_record.ROUND / member_record.JOIN_RETRY - 1
