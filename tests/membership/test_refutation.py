"""The refutation fan-out cap: a burst of refused accusations costs one broadcast per spacing,
not one per accusation, and every accuser is still answered at once (refutation.FanoutCap)."""

from __future__ import annotations

import pytest

from dpeer.membership import Gossip, MemberState, Update, lan
from dpeer.membership.refutation import Fanout, FanoutCap, refutation_targets

from tests.membership.test_core import addr, core, hb

ALIVE, SUSPECT = MemberState.ALIVE, MemberState.SUSPECT
QUIET = {"gossip_interval": 100.0, "probe_interval": 100.0, "push_pull_interval": 1000.0, "reconnect_interval": 1000.0}
"""No gossip, probe, push-pull or reconnect round in these tests' windows: only refutations are sent."""


@pytest.mark.parametrize("times,claims", [
    ([0.0], [Fanout.NOW]),
    ([0.0, 0.01, 0.02], [Fanout.NOW, Fanout.HOLD, Fanout.HELD]),  # one held-back broadcast for the rest
    ([0.0, 0.05], [Fanout.NOW, Fanout.NOW]),  # a spacing apart: both go now
    ([0.0, 0.06, 0.07], [Fanout.NOW, Fanout.NOW, Fanout.HOLD]),
])
def test_fanout_cap_claims(times, claims) -> None:
    cap = FanoutCap(0.2)
    assert [cap.claim(t) for t in times] == claims


def test_a_released_hold_starts_the_next_spacing() -> None:
    cap = FanoutCap(0.2)
    assert cap.claim(1.0) is Fanout.NOW and cap.claim(1.01) is Fanout.HOLD and cap.due == pytest.approx(1.05)
    cap.release(1.05)
    assert cap.claim(1.06) is Fanout.HOLD and cap.due == pytest.approx(1.10)
    cap.release(1.10)
    assert cap.claim(1.2) is Fanout.NOW


def test_refutation_targets_are_the_live_members_and_the_accuser_never_ourselves() -> None:
    assert refutation_targets(set(), "b:1", "a:1") == ["b:1"]
    assert refutation_targets({"c:1", "b:1"}, "b:1", "a:1") == ["b:1", "c:1"]
    assert refutation_targets({"c:1"}, "a:1", "a:1") == ["c:1"]
    assert refutation_targets(set(), None, "a:1") == []


def refutations(out: list, incarnation: int | None = None) -> list[str]:
    """Addresses sent our own alive update (at ``incarnation``, when given)."""
    return [dst for dst, msg in out if isinstance(msg, Gossip) and len(msg.updates) == 1
            and msg.updates[0].node_id == "a" and msg.updates[0].state is ALIVE
            and (incarnation is None or msg.updates[0].incarnation == incarnation)]


def test_a_burst_of_refused_accusations_is_broadcast_once_per_spacing_and_each_accuser_answered() -> None:
    m = core(peers=4, **QUIET)
    spacing = lan().refused_suspicion_timeout / 4
    sent: list[str] = []
    for i in range(20):  # 20 accusations 2 ms apart, from b and c in turn: all inside one spacing
        accuser = "bc"[i % 2]
        out = m.receive(1.0 + i * 0.002, Gossip(hb(accuser), (Update(SUSPECT, "a", addr("a"), m.incarnation, accuser,
                                                                     refused=True),)))
        assert accuser + ":7946" in refutations(out, m.incarnation), (i, out)  # every accuser answered at once
        sent += refutations(out)
    assert m.incarnation == 20
    assert sorted(sent[:4]) == [addr(n) for n in "bcde"]  # the first: every live member
    assert len(sent) == 4 + 19  # then only the accusers (uncapped: 80 messages)
    assert refutations(m.tick(1.0 + spacing - 0.001)) == []
    held = m.tick(1.0 + spacing)
    assert sorted(refutations(held, incarnation=20)) == [addr(n) for n in "bcde"]  # the newest incarnation
    assert refutations(m.tick(1.0 + 3 * spacing)) == []  # one held-back broadcast, not one per accusation


def test_a_refused_accusation_after_the_spacing_is_broadcast_at_once_again() -> None:
    m = core(peers=3, **QUIET)
    first = m.receive(1.0, Gossip(hb("b"), (Update(SUSPECT, "a", addr("a"), 0, "b", refused=True),)))
    later = m.receive(1.5, Gossip(hb("c"), (Update(SUSPECT, "a", addr("a"), 1, "c", refused=True),)))
    assert sorted(refutations(first, 1)) == sorted(refutations(later, 2)) == [addr(n) for n in "bcd"]


def test_a_node_that_leaves_does_not_send_a_held_back_refutation() -> None:
    m = core(peers=3, **QUIET)
    for t in (1.0, 1.01):
        m.receive(t, Gossip(hb("b"), (Update(SUSPECT, "a", addr("a"), m.incarnation, "b", refused=True),)))
    m.leave(1.02)
    assert refutations(m.tick(1.1)) == []
