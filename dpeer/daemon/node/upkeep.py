"""The node's own upkeep, run from the daemon's chores on every box: keep this box's member record
current (node/record_sync.py), notice when it became an active member (systemd's READY=1), say
once per reason why no leader can be elected, and push-pull with committed members gossip does
not know."""

from __future__ import annotations

import logging

from dpeer.daemon.node.driver import Node
from dpeer.daemon.node.record_sync import MemberRecordSync
from dpeer.daemon.notify import Notifier
from dpeer.daemon.serve.status import identity
from dpeer.statemachine.state import MemberStatus

log = logging.getLogger("dpeer.daemon")
INTRODUCE_EVERY = 1.0


class NodeUpkeep:
    """Called from the daemon's chores; see the module docstring."""

    def __init__(self, node: Node, record: MemberRecordSync, notifier: Notifier) -> None:
        self.node, self.record, self.notifier = node, record, notifier
        self.joined = False  # this box became an active member since the daemon started
        self._no_leader_note = ""
        self._last_introduce = 0.0

    def __call__(self, now: float) -> None:
        """One pass: the record, the no-leader note, the join's notice, the introductions."""
        self.record(now)
        self._report_no_leader()
        state = self.node.reads.state
        member = state.members.get(self.node.id)
        if not self.joined and member is not None and member.status is MemberStatus.ACTIVE:
            self.joined = True
            log.info("joined the cluster as an active member")
            self.notifier.ready(f"member of a cluster of {len(state.members)}")
        if now - self._last_introduce >= INTRODUCE_EVERY:
            self._last_introduce = now
            self._introduce_committed_members()

    def _introduce_committed_members(self) -> None:
        """Push-pull with committed active members that gossip does not know (missed joins, reaped
        after a long partition), so the log's membership and gossip's converge."""
        node = self.node
        unknown = [m.addr for n, m in node.reads.state.members.items()
                   if m.status is MemberStatus.ACTIVE and n != node.id and node.swim.state_of(n) is None]
        if unknown:
            node.join_seeds(unknown)

    def _report_no_leader(self) -> None:
        """Log why no leader can be elected and what to do, once per reason, after two election
        timeouts without one (a normal election takes less)."""
        doc = identity(self.node)["no_leader"]
        if doc is None or doc["since_s"] < 2 * self.node.raft_config.election_timeout_max:
            self._no_leader_note = "" if doc is None else self._no_leader_note
            return
        if doc["reason"] != self._no_leader_note:
            self._no_leader_note = doc["reason"]
            level = logging.WARNING if doc["action"] else logging.INFO
            log.log(level, "no leader for %.1fs: %s%s", doc["since_s"], doc["reason"],
                    f". What to do: {doc['action']}" if doc["action"] else "")
