"""A suspicion gossip brought first, then this node's own refused connection: the node tells the
Raft core once (the dead leader's successors campaign at once; 0.49 s of a leader kill on 12-03
was a survivor that had only heard the rumour and kept the lease), and the suspicion keeps its
start time (the leader's quiet window dates the change from it)."""

from __future__ import annotations

from pathlib import Path

from dpeer.daemon.node.driver import Node
from dpeer.membership import MemberState
from dpeer.membership.messages import Gossip, Heartbeat, Update
from dpeer.statemachine.store import Store
from tests.support.clocks import ManualClock


def test_our_own_refusal_after_the_rumour_drops_the_lease_once_and_keeps_the_suspicions_start(tmp_path: Path) -> None:
    clock = ManualClock()
    node = Node("n1", "127.0.0.1:1", Store.open(tmp_path / "s", node_id="n1"), lambda *a: None, clock=clock)
    try:
        lost: list[str] = []
        node.raft.leader_lost = lambda now, n: lost.append(n)  # what the core is told, not what it does
        hb = Heartbeat("n2", "127.0.0.1:2", 0, 0, 0, 0, clock.now())
        node.swim.receive(clock.now(), Gossip(hb, (Update(MemberState.ALIVE, "n3", "127.0.0.1:3", 0, "n2"),)))
        clock.advance(0.1)
        rumour = Update(MemberState.SUSPECT, "n3", "127.0.0.1:3", 0, "n2", refused=True)
        node.swim.receive(clock.now(), Gossip(hb, (rumour,)))
        node._swim_effects(clock.now())
        start = node.since["n3"]
        assert lost == [] and start == (MemberState.SUSPECT, clock.now()), "a relayed refusal is only a rumour"
        clock.advance(0.05)
        node.refused("127.0.0.1:3")
        node.refused("127.0.0.1:3")
        assert lost == ["n3"], "our own refusal is told once"
        assert node.since["n3"] == start, "the suspicion keeps its start"
    finally:
        node.store.close()
