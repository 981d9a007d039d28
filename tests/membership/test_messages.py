"""Validation and size accounting of the wire messages."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpeer.membership import (
    Ack, Gossip, Heartbeat, InvalidMessage, MemberRecord, MemberState, Nack, Ping, PingReq, PushPull, Update,
    wire_size,
)
from dpeer.membership.messages import MAX_UPDATES

HB = Heartbeat("n1", "10.0.0.1:7946", 3, 2, 100, 99, 12.5)
UP = Update(MemberState.SUSPECT, "n2", "host-b:7946", 1, "n1")


def test_valid_messages_pass() -> None:
    for msg in (
        Ping(1, "n2", HB, (UP,)), Ack(1, HB), PingReq(1, "n2", "[::1]:7946", HB), Nack(1, HB), Gossip(HB, (UP,)),
        PushPull(HB, (MemberRecord("n2", "b:1", MemberState.DEAD, 4, 1, 2, 2),), join=True),
    ):
        msg.validate()
        assert wire_size(msg) > 0


@pytest.mark.parametrize(
    "bad",
    [
        dataclasses.replace(HB, node_id=""),
        dataclasses.replace(HB, node_id="x" * 65),
        dataclasses.replace(HB, incarnation=-1),
        dataclasses.replace(HB, term=-2),
        dataclasses.replace(HB, last_applied=2**63),
        dataclasses.replace(HB, commit_index=True),
        dataclasses.replace(HB, sent_at=float("nan")),
        dataclasses.replace(HB, addr="nohost"),
        dataclasses.replace(HB, addr="host:0"),
        dataclasses.replace(HB, addr="host:99999"),
        dataclasses.replace(HB, addr=":7946"),
        dataclasses.replace(HB, addr="ho st:7946"),
    ],
)
def test_absurd_heartbeats_are_rejected(bad: Heartbeat) -> None:
    with pytest.raises(InvalidMessage):
        Gossip(bad).validate()


def test_absurd_envelopes_are_rejected() -> None:
    with pytest.raises(InvalidMessage):
        Gossip(HB, (UP,) * (MAX_UPDATES + 1)).validate()
    with pytest.raises(InvalidMessage):
        Ping(-1, "n2", HB).validate()
    with pytest.raises(InvalidMessage):
        Ping(1, "", HB).validate()
    with pytest.raises(InvalidMessage):
        PingReq(1, "n2", "nope", HB).validate()
    with pytest.raises(InvalidMessage):
        Gossip(HB, (dataclasses.replace(UP, state="zombie"),)).validate()
    with pytest.raises(InvalidMessage):
        PushPull(HB, (MemberRecord("n2", "b:1", MemberState.ALIVE, -4),)).validate()


@given(st.integers(min_value=0, max_value=MAX_UPDATES))
def test_size_grows_with_piggyback(n: int) -> None:
    assert wire_size(Gossip(HB, (UP,) * n)) == wire_size(Gossip(HB)) + n * wire_size(Gossip(HB, (UP,))) - n * wire_size(Gossip(HB))
