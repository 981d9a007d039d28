"""The stranger's requests on the rendezvous store's own wire (dpeer/chaos/store_probe.py): the
chaos package may not import the trainer, so its frames are built apart; here they are checked
against rendezvous_wire's, and a live store refuses every one (while a request under the right key
would be run, which the probe tells apart)."""

from __future__ import annotations

import asyncio
import random
import socket
from types import SimpleNamespace

from dpeer.chaos import store_probe
from dpeer.chaos.command import _stranger_row
from dpeer.chaos.options import ChaosOptions
from dpeer.chaos.store_probe import Outcome, probe, probes, request
from dpeer.chaos.stranger import Tally, speak_the_wire
from dpeer.trainer import rendezvous_wire as wire
from dpeer.trainer.group import derive
from dpeer.trainer.rendezvous import RendezvousClient
from dpeer.trainer.rendezvous_server import RendezvousServer
from dpeer.trainer.rendezvous_table import LIMITS, Status

KEY = derive("the view's secret", "rendezvous", 5)


def test_the_frames_are_rendezvous_wire_frames() -> None:
    assert (store_probe.MAGIC, store_probe.NONCE_BYTES, store_probe.TAG_BYTES) == (
        wire.MAGIC, wire.NONCE_BYTES, wire.TAG_BYTES)
    nonce = bytes(range(16))
    for message in ([5, 1, "compare_set", ["sealed", b"", b"abandoned"]], [6, 3, "get", ["sealed"]],
                    [7, 1, "set", ["stranger-1", b"x" * store_probe.BIG_VALUE]]):
        assert request(KEY, nonce, *message[:3], message[3]) == wire.frame(KEY, b"q", nonce, message)
    assert store_probe.BIG_VALUE == LIMITS.max_value  # the largest value, in a frame the store takes
    assert store_probe.NOT_SERVED == Status.UNKNOWN.value


def test_a_visit_probes_the_current_generation_and_the_next_with_guessed_keys() -> None:
    planned = probes(5, random.Random(3))
    assert [(g, op) for g, _, op, _ in planned] == [(g, op) for g in (5, 6, 7) for op in ("compare_set", "get", "set")]
    assert planned[0][3] == ["sealed", b"", b"abandoned"] and len(planned[2][3][1]) == LIMITS.max_value
    keys = {key for _, key, _, _ in planned}
    empty_secret = {derive("", "rendezvous", g) for g in (5, 6, 7)}
    assert keys & empty_secret and keys - empty_secret  # keys derived from an empty secret, and random ones
    assert all(key in empty_secret or len(key) == 32 for key in keys)
    assert not keys & {derive("the view's secret", "rendezvous", g) for g in (5, 6, 7)}
    assert [g for g, *_ in probes(None, random.Random(3))][:3] == [1, 1, 1]


def _served() -> RendezvousServer:
    listen = socket.create_server(("127.0.0.1", 0))
    server = RendezvousServer(listen)
    server.allow(5, KEY)
    return server


def test_a_live_store_refuses_the_stranger_and_keeps_nothing() -> None:
    server = _served()
    try:
        tally = Tally()
        asyncio.run(speak_the_wire(tally, "training", f"127.0.0.1:{server.port}", 5, random.Random(7)))
        assert tally.requests == {"refused": 3, "not served": 6, "ran": 0, "silent": 0}, tally.requests
        assert tally.ran == [] and tally.answered() == 9 and tally.sent > 3 * LIMITS.max_value
        assert "9 store requests under guessed keys" in tally.note() and "3 refused" in tally.note()
        member = RendezvousClient("127.0.0.1", server.port)
        assert member.call(5, KEY, "get", ["sealed"]) == (Status.ABSENT, None)  # not "abandoned"
        assert member.call(5, KEY, "num_keys", []) == (Status.OK, 0)
        member.close()
        # the probe tells a request the store ran apart: under the generation's own key it is run
        ran = asyncio.run(probe("127.0.0.1", server.port, 5, KEY, "get", ["sealed"], 5.0))
        assert ran[0] is Outcome.RAN
    finally:
        server.close()


def test_the_row_fails_on_a_request_run_and_says_not_run_when_no_store_answered() -> None:
    run = SimpleNamespace(opts=ChaosOptions(), stranger=Tally())
    checks: dict[str, list[str]] = {}
    notes: dict[str, str] = {}
    skipped: dict[str, str] = {}
    _stranger_row(run, checks, notes, skipped)
    assert skipped == {"stranger's store requests refused": "not run: no rendezvous store met the stranger's "
                                                            "requests (0 made, none greeted and answered)"}
    run.stranger.requests.update({"refused": 2, "not served": 4})
    run.stranger.ran.append("n1:4000 ran a stranger's get for generation 5 during training")
    _stranger_row(run, checks, notes, skipped)
    assert checks == {"stranger's store requests refused": run.stranger.ran}
    assert "6 store requests under guessed keys" in notes["stranger's store requests refused"]
    run, skipped = SimpleNamespace(opts=ChaosOptions(kinds=("kill",)), stranger=Tally()), {}
    _stranger_row(run, {}, {}, skipped)
    assert skipped == {"stranger's store requests refused": "not run (stranger is not among --kinds)"}


def test_a_port_that_does_not_greet_gets_one_request_then_no_more() -> None:
    """A worker's store port that serves no store now (bound and listening, nobody answering): the
    visit's first request goes unanswered and the rest are skipped, so a visit stays short."""
    with socket.create_server(("127.0.0.1", 0)) as quiet:
        tally = Tally()
        asyncio.run(speak_the_wire(tally, "formation", f"127.0.0.1:{quiet.getsockname()[1]}", None, random.Random(1)))
    assert tally.requests == {"refused": 0, "not served": 0, "ran": 0, "silent": 1} and tally.answered() == 0
    assert tally.connections == {"formation": 1}
