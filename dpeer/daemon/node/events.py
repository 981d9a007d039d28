"""The events a node driver tells the code above it (the daemon), and what the leader takes from
the boxes' reports: named interfaces instead of listener lists and callables set after construction."""

from __future__ import annotations

from typing import Protocol

from dpeer.daemon.decide.checkpoints import Held
from dpeer.daemon.decide.failures import FailureReport
from dpeer.membership import HeartbeatObserved
from dpeer.statemachine.entry import Entry
from dpeer.statemachine.state import ApplyResult


class NodeEvents(Protocol):
    """What the driver tells the daemon, from its one loop."""

    def chores(self, now: float) -> None:
        """Periodic work (see node/timers.py LEADER_CHORES); also run at once after chores_now()."""

    def busy(self) -> bool:
        """True while the chores must stay frequent though nothing changed (see NodeTimers._chore_period)."""

    def applied(self, entry: Entry, result: ApplyResult) -> None:
        """One committed entry was applied to the state machine."""

    def heartbeat(self, seen: HeartbeatObserved) -> None:
        """A peer's heartbeat (its versions) arrived."""


class NoEvents:
    """A node with nothing above it (tests of the driver alone)."""

    def chores(self, now: float) -> None:
        """Nothing to do."""

    def busy(self) -> bool:
        """Never busy."""
        return False

    def applied(self, entry: Entry, result: ApplyResult) -> None:
        """Nobody listens."""

    def heartbeat(self, seen: HeartbeatObserved) -> None:
        """Nobody listens."""


class LeaderIntake(Protocol):
    """What a leader takes from the boxes (node/leader_chores.py): a box's own report while this
    node leads, or one the service received for it."""

    def group_failed(self, generation: int, report: FailureReport) -> None:
        """A box's group of `generation` failed, or its job's build did."""

    def checkpoint_reported(self, node_id: str, held: Held) -> int:
        """A box holds a checkpoint; returns the committed checkpoint's step."""
