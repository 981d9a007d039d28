"""The in-memory transport (dpeer/transport/memory.py): link order, one-way cuts, refusals,
pauses, errors crossing a call as they cross gRPC, and envelopes checked as the wire checks them."""

from __future__ import annotations

import asyncio
import random

import pytest

from dpeer import errors
from dpeer.consensus.messages import AppendRequest, Peer
from dpeer.membership.messages import Gossip, Heartbeat
from dpeer.sim.network import LinkPolicy, SimNetwork
from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.transport.api import Envelope
from dpeer.transport import checks, wire
from dpeer.transport.calls import EntryChunk, FetchEntriesRequest, StatusReply
from dpeer.transport.memory import MemoryClient, MemoryNetwork

from tests.house.loop import VirtualLoop


class Handler:
    """Records envelopes; answers status, or raises what it is told to."""

    def __init__(self) -> None:
        self.got: list[str] = []
        self.envelopes: list[Envelope] = []
        self.malformed: list[str] = []
        self.raise_: Exception | None = None

    def note_malformed(self, method: str) -> None:
        self.malformed.append(method)

    async def deliver(self, envelope: Envelope) -> None:
        self.got.append(envelope.sender.node_id)
        self.envelopes.append(envelope)

    async def status(self) -> StatusReply:  # as PeerHandler.status: no request
        if self.raise_ is not None:
            raise self.raise_
        return StatusReply(json="{}")


UID = "0" * 32


def env(sender: str, msg: object = None) -> Envelope:
    """A valid envelope from sender (a gossip with its heartbeat unless msg is given)."""
    hb = Heartbeat(sender, f"{sender}:1", 0, 0, 0, 0, 0.0)
    return Envelope(msg or Gossip(hb), Peer(sender, UID, 0), f"{sender}:1")


def world() -> tuple[VirtualLoop, MemoryNetwork, dict[str, Handler]]:
    loop = VirtualLoop()
    net = MemoryNetwork(SimNetwork(random.Random(1), LinkPolicy(delay_min=0.001, delay_max=0.05)))
    handlers = {n: Handler() for n in ("a", "b")}
    for n, h in handlers.items():
        net.attach(f"{n}:1", n, h)
    return loop, net, handlers


def test_envelopes_keep_link_order_and_a_one_way_cut_cuts_one_way() -> None:
    loop, net, h = world()
    refused: list[str] = []

    async def go() -> None:
        a = net.transport("a", "a:1")(refused.append)
        b = net.transport("b", "b:1")(refused.append)
        for i in range(20):
            a.send("b:1", env(f"a{i}"))
        await asyncio.sleep(1.0)
        net.links.block("b", "a")
        b.send("a:1", env("cut"))
        a.send("b:1", env("open"))
        await asyncio.sleep(1.0)
        net.detach("b:1")
        a.send("b:1", env("late"))
        await asyncio.sleep(1.0)

    loop.run_until_complete(go())
    assert h["b"].got == [f"a{i}" for i in range(20)] + ["open"]  # in order, though delays vary
    assert h["a"].got == []  # b -> a is cut, a -> b is not
    assert refused == ["b:1"]


def test_a_paused_host_gets_what_arrived_when_it_resumes() -> None:
    loop, net, h = world()

    async def go() -> None:
        a = net.transport("a", "a:1")(lambda addr: None)
        net.pause("b:1")
        a.send("b:1", env("x"))
        await asyncio.sleep(1.0)
        assert h["b"].got == []
        net.resume("b:1")
        await asyncio.sleep(0.01)

    loop.run_until_complete(go())
    assert h["b"].got == ["x"]


@pytest.mark.parametrize("raised, expected", [
    (errors.BadRequest("no"), errors.BadRequest), (errors.Unavailable("no leader"), errors.Unreachable),
    (errors.Unreachable("x"), errors.PeerError), (ValueError("bug"), errors.PeerError),
])
def test_errors_cross_a_call_as_through_grpc(raised: Exception, expected: type) -> None:
    loop, net, h = world()
    h["b"].raise_ = raised

    async def go() -> None:
        with pytest.raises(expected) as info:
            await MemoryClient(net, "a", "b:1").status()
        assert type(info.value) is expected

    loop.run_until_complete(go())
    assert (net.crashes != []) == isinstance(raised, ValueError)


def test_a_cut_request_times_out_and_a_detached_host_refuses() -> None:
    loop, net, _ = world()

    async def go() -> None:
        net.links.block("a", "b")
        start = loop.time()
        with pytest.raises(errors.Unreachable, match="in time"):
            await MemoryClient(net, "a", "b:1", timeout=2.0).status()
        assert loop.time() - start == pytest.approx(2.0)
        net.detach("b:1")
        with pytest.raises(errors.Unreachable) as info:
            await MemoryClient(net, "a", "b:1").status()
        assert info.value.refused

    loop.run_until_complete(go())


def test_an_envelope_the_wire_refuses_is_refused_here_and_recorded() -> None:
    """A core that sends what the gRPC server would refuse (here a negative incarnation, a bad
    boot) is a bug the simulation reports; the handler never sees the envelope."""
    loop, net, h = world()
    bad_hb = Heartbeat("a", "a:1", -1, 0, 0, 0, 0.0)

    async def go() -> None:
        a = net.transport("a", "a:1")(lambda addr: None)
        a.send("b:1", env("a", Gossip(bad_hb)))
        a.send("b:1", Envelope(Gossip(Heartbeat("a", "a:1", 0, 0, 0, 0, 0.0)), Peer("a", UID, 0), "a:1", boot="xyz"))
        a.send("b:1", env("a"))
        await asyncio.sleep(1.0)

    loop.run_until_complete(go())
    assert h["b"].got == ["a"]  # only the valid one
    assert h["b"].malformed == ["Deliver", "Deliver"]
    assert len(net.crashes) == 2
    assert "incarnation" in net.crashes[0] and "from_boot" in net.crashes[1], net.crashes


def test_entries_arrive_rebuilt_from_their_encoded_form() -> None:
    """As over the wire, the receiver gets its own entry objects (equal, not the sender's), and an
    entry that cannot be encoded is refused."""
    loop, net, h = world()
    entries = (Entry(1, 1, EntryKind.KV_PUT, {"key": "k", "value": "v"}),)
    good = AppendRequest(term=1, leader="a", prev_index=0, prev_term=0, entries=entries, commit=0)
    unencodable = AppendRequest(term=1, leader="a", prev_index=0, prev_term=0,
                                entries=(Entry(1, 1, EntryKind.KV_PUT, {"key": object()}),), commit=0)

    async def go() -> None:
        a = net.transport("a", "a:1")(lambda addr: None)
        a.send("b:1", env("a", good))
        a.send("b:1", env("a", unencodable))
        await asyncio.sleep(1.0)

    loop.run_until_complete(go())
    [got] = h["b"].envelopes
    assert got.msg.entries == entries and got.msg.entries[0] is not entries[0]
    assert got.msg.entries[0].payload is not entries[0].payload
    assert h["b"].malformed == ["Deliver"] and "would not carry" in net.crashes[0], net.crashes


def test_a_fetched_chunk_of_many_small_entries_crosses_as_over_the_wire() -> None:
    """A chunk is bounded by its bytes (a megabyte of no-ops is tens of thousands of entries) and
    the gRPC client takes any count: the simulation must not refuse it (a resync would fail there
    for ever while it works on real boxes)."""
    loop, net, h = world()
    entries = tuple(Entry(i, 1, EntryKind.NOOP, {}) for i in range(1, checks.MAX_ENTRIES_PER_MESSAGE + 2))
    chunk = EntryChunk(entries, len(entries), 1, UID, 1)
    assert wire.parsed(wire.to_wire(chunk)) == chunk  # the wire carries it

    async def fetch_entries(request: FetchEntriesRequest):
        yield chunk

    h["b"].fetch_entries = fetch_entries  # type: ignore[attr-defined]

    async def go() -> list:
        return [c async for c in MemoryClient(net, "a", "b:1").fetch_entries(1, 0, "a")]

    [got] = loop.run_until_complete(go())
    assert got == chunk and got.entries[0] is not entries[0]


def test_an_envelope_of_the_wrong_shape_is_recorded_not_lost() -> None:
    """A core that sends a message the wire's encoder could not even take (here a gossip with no
    heartbeat object) is a bug: recorded in crashes, never an exception lost in a task."""
    loop, net, h = world()

    async def go() -> None:
        a = net.transport("a", "a:1")(lambda addr: None)
        a.send("b:1", env("a", Gossip(None)))  # type: ignore[arg-type]
        await asyncio.sleep(1.0)

    loop.run_until_complete(go())
    assert h["b"].got == [] and len(net.crashes) == 1 and "could not carry" in net.crashes[0], net.crashes
