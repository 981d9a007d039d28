"""The wire's conversions (transport/codec.py, transport/wire.py): core messages and calls cross
unchanged, and a hostile envelope is refused before any core sees it."""

from __future__ import annotations

import pytest

from dpeer.consensus.messages import Peer
from dpeer.errors import BadRequest
from dpeer.membership.messages import Gossip, Heartbeat, MemberRecord, MemberState
from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.transport import calls, codec, wire
from dpeer.transport.api import Envelope

UID, COPY = "a" * 32, "0123456789abcdef"


def gossip(boot: str = COPY, up: float = 1.0) -> Envelope:
    return Envelope(Gossip(Heartbeat("n1", "127.0.0.1:1", 0, 0, 0, 0, 5.0), ()), Peer("n1", UID, 1),
                    "127.0.0.1:1", "", boot, up)


def test_an_envelope_crosses_the_wire_unchanged() -> None:
    sent = gossip()
    assert codec.decode(codec.encode(sent)) == sent


@pytest.mark.parametrize("boot, up, sentence", [
    ("1" * 15, 1.0, "the envelope's from_boot must be 16 lowercase hex digits"),
    ("g" * 16, 1.0, "the envelope's from_boot must be 16 lowercase hex digits"),
    (COPY, float("inf"), "the envelope's from_up must be seconds in 0..1e+10"),
])
def test_an_envelope_with_a_bad_boot_or_age_is_refused(boot: str, up: float, sentence: str) -> None:
    with pytest.raises(BadRequest) as refused:
        codec.decode(codec.encode(gossip(boot, up)))
    assert str(refused.value) == sentence


def test_calls_cross_the_wire_unchanged() -> None:
    entry = Entry(3, 2, EntryKind.NOOP, {})
    row = MemberRecord("n2", "127.0.0.1:2", MemberState.SUSPECT, 4, 2, 3, 3)
    for call in (calls.EntryChunk((entry,), 3, 2, UID, 1), calls.JoinReply(True, "n1", "127.0.0.1:1", (row,)),
                 calls.KvListReply((calls.KvPair("a", "1"), calls.KvPair("b", "2")), 7),
                 calls.JoinRequest("n3", "127.0.0.1:3", 29500, True, UID, COPY, 1.5, "rack-a", ("n1", "n2")),
                 calls.JoinRequest("n3", "127.0.0.1:3", 29500, True, UID, COPY, 1.5, "rack-a", (), 0),
                 calls.JoinRequest("n3", "127.0.0.1:3", speed_class=-7),
                 calls.ForceRequest(("n1",), True), calls.CheckpointChunk(4, 0, b"model", 5, True)):
        assert wire.parsed(wire.to_wire(call)) == call


def test_an_unset_speed_class_crosses_the_wire_as_unknown_and_a_set_zero_as_class_0() -> None:
    unset, zero = wire.to_wire(calls.JoinRequest("n3")), wire.to_wire(calls.JoinRequest("n3", speed_class=0))
    assert not unset.HasField("speed_class") and zero.HasField("speed_class")
    assert wire.from_wire(calls.JoinRequest, unset).speed_class is None  # an older peer's join: unknown
    assert wire.from_wire(calls.JoinRequest, zero).speed_class == 0


def test_an_invalid_message_is_refused_under_its_wire_name() -> None:
    """The refusal's text (logged, and answered to the peer) names the Envelope's field, as it
    always has: `invalid vote_request: ...`, not the core's class name."""
    from dpeer.consensus.messages import VoteRequest
    bad = Envelope(VoteRequest(0, "n1", 0, 0, False), Peer("n1", UID, 1), "127.0.0.1:1", "", COPY, 1.0)
    with pytest.raises(BadRequest, match=r"^invalid vote_request: "):
        codec.decode(codec.encode(bad))
