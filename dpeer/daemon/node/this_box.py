"""This box as its member record should say it now: its worker's store port and readiness, its
site, its speed class, and whether the daemon is leaving (node/record_sync.py Box, read by the
record's sync and the leader's chores)."""

from __future__ import annotations

from dpeer.daemon.decide.sites import near_peers
from dpeer.daemon.decide.speeds import speed_class
from dpeer.daemon.node.driver import Node
from dpeer.daemon.worker.supervisor import Worker
from dpeer.statemachine.state import MemberStatus


class ThisBox:
    """The daemon's Box: read from its worker, its configuration and the node's probes."""

    def __init__(self, node: Node, worker: Worker | None, configured_site: str, by_speed: bool = True) -> None:
        """by_speed: config training.split is "speed" (else "even": the box tells no speed class)."""
        self.node, self.worker, self.configured_site, self.by_speed = node, worker, configured_site, by_speed
        self.leaving = False

    def store_port(self) -> int:
        """The port the worker bound for the rendezvous store it hosts as rank 0 (0: no worker)."""
        return self.worker.store_port if self.worker is not None else 0

    def ready(self) -> bool:
        """Whether this node can train now: no job, or a worker that built it and waits."""
        return self.worker is None or self.worker.ready

    def site(self) -> tuple[str, tuple[str, ...]]:
        """This box's configured site, or ("", the peers it measures near) when it names none: of its
        committed active members only (a peer committed dead or left links nothing, and kept, the
        record would name every id ever measured near, for good: no sample keeps what was)."""
        if self.configured_site:
            return self.configured_site, ()
        node = self.node
        members = node.reads.state.members
        me = members.get(node.id)
        active = {n for n, m in members.items() if m.status is MemberStatus.ACTIVE and n != node.id}
        samples = {n: rtts for n, rtts in node.probes.recent_ms().items() if n in active}
        return "", near_peers(samples, [n for n in me.near if n in active] if me is not None else ())

    def speed_class(self) -> int | None:
        """This box's speed class from its worker's latest speed, held near its committed class
        (hysteresis); the committed class while the worker has reported none (a restarted worker);
        None (unknown, which keeps the whole group even) when the box's split is even."""
        if not self.by_speed:
            return None
        me = self.node.reads.state.members.get(self.node.id)
        committed = me.speed_class if me is not None else None
        speed = self.worker.speed if self.worker is not None else None
        return committed if speed is None else speed_class(speed, committed)
