"""The per-peer message stream: batching, refusal reporting after a break, token, bad batches."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import grpc
import pytest

from dpeer.errors import BadRequest
from dpeer.transport.api import Envelope
from dpeer.transport.client import Channels, PeerSender
from dpeer.transport.options import MAX_BATCH_MESSAGES, TOKEN_HEADER, Security
from dpeer.transport.server import serve
from dpeer.proto.v1 import dpeer_pb2 as pb

WAIT = 20.0


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


class Handler:
    """Records delivered envelopes (decoded by the server); refuses those from 'forger'."""

    def __init__(self) -> None:
        self.got: list[Envelope] = []
        self.malformed: list[str] = []
        self.arrived = asyncio.Event()

    def note_malformed(self, method: str) -> None:
        self.malformed.append(method)

    def node_id(self) -> str:
        return "receiver"

    def may_forward(self, node_id: str) -> bool:
        return False

    async def deliver(self, envelope: Envelope) -> None:
        if envelope.sender.node_id == "forger":
            raise BadRequest("forged")
        self.got.append(envelope)
        self.arrived.set()


def env(i: int, from_id: str = "a") -> pb.Envelope:
    heartbeat = pb.RaftHeartbeat(term=1, leader=from_id, commit=i)
    return pb.Envelope(from_id=from_id, from_addr="127.0.0.1:1", from_uid="a" * 32, raft_heartbeat=heartbeat)


async def until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_one_stream_carries_batches_in_order_and_a_refused_message_does_not_end_it() -> None:
    async def go() -> None:
        addr, handler, rtts = free_addr(), Handler(), []
        server = await serve(addr, handler, Security())
        sender = PeerSender(Channels(Security()), on_refused=lambda a: None, on_rtt=rtts.append)
        try:
            for i in range(1, 51):
                sender.send(addr, env(i, "forger" if i == 25 else "a"))
            await until(lambda: len(handler.got) == 49, "49 envelopes")
            assert [e.msg.commit for e in handler.got] == [i for i in range(1, 51) if i != 25]
            assert sender.batches < 49, "envelopes of one loop turn leave together"
            # the server's first answer (which times the open) may reach us after its handler got them all
            await until(lambda: rtts, "the stream's open timed")
            sender.send(addr, env(51))
            await until(lambda: len(handler.got) == 50, "the stream survives a refused envelope")
        finally:
            await sender.close()
            await server.stop(0.1)

    asyncio.run(go())


def test_a_broken_stream_reports_the_refusal_without_waiting_for_the_next_message() -> None:
    async def go() -> None:
        addr, handler, refused = free_addr(), Handler(), []
        server = await serve(addr, handler, Security())
        sender = PeerSender(Channels(Security()), on_refused=refused.append)
        try:
            sender.send(addr, env(1))
            await until(lambda: handler.got, "the first envelope")
            t0 = time.monotonic()
            await server.stop(0.1)
            await until(lambda: refused, "a refusal")
            assert refused[0] == addr and time.monotonic() - t0 < 5.0
            server = await serve(addr, handler, Security())  # the peer comes back: the next message gets through
            await until(lambda: (sender.send(addr, env(2)), len(handler.got) > 1)[1], "delivery after restart")
        finally:
            await sender.close()
            await server.stop(0.1)

    asyncio.run(go())


def test_the_stream_needs_the_cluster_token_and_refuses_bad_batches() -> None:
    async def go() -> None:
        addr, handler = free_addr(), Handler()
        server = await serve(addr, handler, Security(token="s3cret"))
        tokenless = PeerSender(Channels(Security()), on_refused=lambda a: None)
        member = PeerSender(Channels(Security(token="s3cret")), on_refused=lambda a: None)
        channel = grpc.aio.insecure_channel(addr)
        try:
            tokenless.send(addr, env(1))
            member.send(addr, env(2))
            await until(lambda: handler.got, "the member's envelope")
            await asyncio.sleep(0.3)
            assert [e.msg.commit for e in handler.got] == [2]
            stream = channel.stream_unary("/dpeer.v1.Peer/Stream")
            for label, body in (("undecodable", b"\xff\xff\xff"),
                                ("too many", pb.EnvelopeBatch(envelopes=[env(3)] * (MAX_BATCH_MESSAGES + 1))
                                 .SerializeToString())):
                call = stream(metadata=((TOKEN_HEADER, "s3cret"),))
                await call.write(body)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, label
            assert handler.malformed == ["Stream", "Stream"] and len(handler.got) == 1
        finally:
            await tokenless.close()
            await member.close()
            await channel.close()
            await server.stop(0.1)

    asyncio.run(go())
