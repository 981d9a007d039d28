"""MemberRecordSync's update round on the virtual clock: a seed that holds the request does not
stop the others, and a seed that refused is tried again (the start-up race of the hung-worker
test: a refused seed, then 5 s waited on a peer that knew no leader)."""

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
    """n1 refuses until `listens_at`, then accepts; n3 holds every request until its timeout."""

    def __init__(self, loop: asyncio.AbstractEventLoop, listens_at: float) -> None:
        self.loop, self.listens_at, self.calls = loop, listens_at, []

    def client(self, addr: str, timeout: float) -> SimpleNamespace:
        async def join(*_: object) -> pb.JoinReply:
            self.calls.append((round(self.loop.time(), 3), addr))
            if addr == "n3":
                await asyncio.sleep(timeout)
                raise errors.Unreachable(f"{addr}: deadline exceeded")
            if self.loop.time() < self.listens_at:
                raise errors.Unreachable(f"{addr}: connection refused")
            return pb.JoinReply(accepted=True, leader_id="n1")
        return SimpleNamespace(join=join)


def _round(listens_at: float) -> tuple[_Node, _Transport, float]:
    loop = VirtualLoop()
    try:
        node, transport = _Node(loop), _Transport(loop, listens_at)
        sync = MemberRecordSync(node, transport, ["n1", "n3"], lambda: 7, lambda: True)

        async def main() -> float:
            sync(loop.time(), leaving=False)
            await sync.task
            return loop.time()
        return node, transport, loop.run_until_complete(main())
    finally:
        loop.close()


def test_a_refused_seed_is_tried_again_while_another_holds_the_request() -> None:
    node, transport, took = _round(listens_at=0.3)
    assert node.admitted_by == "n1" and node.nudged == 1
    assert transport.calls[:2] == [(0.0, "n1"), (0.0, "n3")]
    assert transport.calls[-1] == (member_record.JOIN_RETRY, "n1")
    assert took == member_record.JOIN_RETRY  # not the 5 s the held request would have cost


def test_a_round_that_finds_no_one_ends_within_its_bound() -> None:
    node, transport, took = _round(listens_at=1e9)
    assert node.admitted_by is None and node.nudged == 0
    assert took <= member_record.ROUND + 1e-9
    assert [a for _, a in transport.calls].count("n3") == 1  # never two requests to one address at once
    assert [a for _, a in transport.calls].count("n1") >= member_record.ROUND / member_record.JOIN_RETRY - 1
