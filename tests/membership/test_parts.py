"""The small pieces: broadcast queue, suspicion formula, awareness, presets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpeer.membership import MemberState, Update, edge, lan, preset, wan
from dpeer.membership.awareness import Awareness
from dpeer.membership.broadcast import BroadcastQueue, retransmit_limit
from dpeer.membership.suspicion import Suspicion, suspicion_timeout


def up(node: str, inc: int = 0) -> Update:
    return Update(MemberState.ALIVE, node, f"{node}:1", inc, node)


def test_retransmit_limit_matches_memberlist() -> None:
    assert [retransmit_limit(4, n) for n in (1, 9, 10, 99, 100, 999, 1000)] == [4, 4, 8, 8, 12, 12, 16]


def test_suspicion_timeout_matches_memberlist() -> None:
    assert suspicion_timeout(4, 1, 1.0) == 4.0
    assert suspicion_timeout(4, 10, 1.0) == 4.0
    assert suspicion_timeout(4, 1000, 1.0) == pytest.approx(12.0)
    assert suspicion_timeout(2, 100, 0.5) == pytest.approx(2.0)


def test_queue_sends_least_sent_newest_first_and_replaces() -> None:
    q = BroadcastQueue()
    q.push(up("a"))
    assert q.take(1, 10) == (up("a"),)
    q.push(up("b"))
    q.push(up("c"))
    assert q.take(2, 10) == (up("c"), up("b"))
    q.push(up("a", 5))  # replaces the queued older update about a
    assert q.take(10, 10)[0] == up("a", 5) and len(q) == 3


@given(st.integers(min_value=1, max_value=20), st.integers(min_value=1, max_value=8), st.integers(1, 30))
def test_every_update_is_sent_exactly_limit_times(limit: int, per_msg: int, n: int) -> None:
    q = BroadcastQueue()
    for i in range(n):
        q.push(up(f"n{i}"))
    counts: dict[str, int] = {}
    while len(q):
        for u in q.take(per_msg, limit):
            counts[u.node_id] = counts.get(u.node_id, 0) + 1
    assert counts == {f"n{i}": limit for i in range(n)}


def test_suspicion_confirmations() -> None:
    s = Suspicion("a", 10.0, 2, 1.0, 3.0, False)
    assert s.deadline == 13.0
    assert s.confirm("b") and s.deadline == pytest.approx(11.0 + 2 - 2 * 0.6309, abs=1e-3)
    assert not s.confirm("b")
    assert s.confirm("c") and s.deadline == pytest.approx(11.0)
    assert not s.confirm("d")  # k reached
    assert Suspicion("a", 0.0, 0, 1.0, 3.0, False).deadline == 1.0
    r = Suspicion("a", 0.0, 2, 1.0, 3.0, False)
    assert r.expedite(0.5, 0.2) and r.deadline == pytest.approx(0.7) and not r.expedite(0.6, 0.2)


def test_awareness_bounds_and_scale() -> None:
    a = Awareness(8)
    a.apply(-1)
    assert a.score == 0 and a.scale(0.5) == 0.5
    a.apply(20)
    assert a.score == 7 and a.scale(0.5) == 4.0


def test_presets() -> None:
    for cfg in (lan(), wan(), edge()):
        assert cfg.probe_timeout < cfg.probe_interval and cfg.indirect_checks >= 1
    assert preset("lan") == lan()
    with pytest.raises(ValueError):
        preset("moon")
