"""When a node's chores run: a chores_at() asked for during a pass is kept (the leader decides a
view the moment its quiet window ends, not at the next idle pass a second later)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpeer.daemon.node.driver import Node
from dpeer.daemon.node.timers import CHORES_BUSY_FOR, IDLE_CHORES
from dpeer.statemachine.store import Store
from tests.support.clocks import ManualClock


class _Events:
    """NodeEvents whose chores ask to run again `again` seconds later (or raise)."""

    def __init__(self, again: float, fail: bool = False) -> None:
        self.node: Node | None = None
        self.again, self.fail, self.passes = again, fail, []

    def chores(self, now: float) -> None:
        self.passes.append(now)
        assert self.node is not None
        self.node.timers.chores_at(now + self.again)
        if self.fail:
            raise RuntimeError("a chore failed")

    def busy(self) -> bool:
        return False

    def applied(self, entry: object, result: object) -> None:
        pass

    def heartbeat(self, seen: object) -> None:
        pass


def _idle_node(tmp_path: Path, events: _Events, clock: ManualClock) -> Node:
    node = Node("n1", "127.0.0.1:1", Store.open(tmp_path / "s", node_id="n1"), lambda *a: None, clock=clock,
                events=events)
    events.node = node
    clock.advance(CHORES_BUSY_FOR + 0.1)  # nothing changed for a while: idle passes, IDLE_CHORES apart
    return node


@pytest.mark.parametrize("fail", [False, True], ids=["chores return", "a chore raises"])
def test_a_wake_asked_for_during_the_pass_is_kept(tmp_path: Path, fail: bool) -> None:
    clock, events = ManualClock(), _Events(again=0.3, fail=fail)
    node = _idle_node(tmp_path, events, clock)
    try:
        if fail:
            with pytest.raises(RuntimeError):
                node.timers.step()
        else:
            node.timers.step()
        assert events.passes == [clock.now()]
        assert node.timers.next_chores == pytest.approx(clock.now() + 0.3)  # not the idle period, IDLE_CHORES
    finally:
        node.store.close()


def test_without_a_wake_an_idle_node_waits_the_idle_period(tmp_path: Path) -> None:
    clock, events = ManualClock(), _Events(again=5.0)
    node = _idle_node(tmp_path, events, clock)
    try:
        node.timers.step()
        assert node.timers.next_chores == pytest.approx(clock.now() + IDLE_CHORES)
    finally:
        node.store.close()
