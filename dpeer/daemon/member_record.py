"""Keep this box's own committed member record (address, store port, readiness, store identity)
in line with what it is now, through the leader or the seeds; the first such update is the join.

One request in flight at a time. The same update goes again only after JOIN_RETRY (the last one
may still be on its way into our log); a different one goes at once, so a worker that became
ready while the last update was in flight is trained with without waiting out the retry.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Sequence

from dpeer import errors
from dpeer.consensus import Role
from dpeer.daemon.node import Node
from dpeer.transport.api import Transport

log = logging.getLogger("dpeer.daemon")
JOIN_RETRY = 0.5
Record = tuple[str, str, int, bool, str]  # status, address, store port, ready, store uid


class MemberRecordSync:
    """Called from the daemon's chores; see the module docstring."""

    def __init__(self, node: Node, transport: Transport, seeds: Sequence[str], store_port: Callable[[], int],
                 ready: Callable[[], bool]) -> None:
        self.node, self.transport, self.seeds = node, transport, list(seeds)
        self.store_port, self.ready = store_port, ready
        self.task: asyncio.Task | None = None
        self._next = 0.0
        self._sent: Record | None = None  # the record the last update asked for

    def wanted(self) -> Record:
        """Our member record as it should read now."""
        return ("active", self.node.addr, self.store_port(), self.ready(), self.node.store.uid)

    def __call__(self, now: float, leaving: bool) -> None:
        """Start an update if our record is out of date and we do not lead (nor leave)."""
        if self.node.role is Role.LEADER or leaving or (self.task is not None and not self.task.done()):
            return
        member = self.node.store.state.members.get(self.node.id)
        wanted = self.wanted()
        if member is not None and (member.status, member.addr, member.store_port, member.ready, member.uid) == wanted:
            return
        if now < self._next and wanted == self._sent:
            return
        self._next, self._sent = now + JOIN_RETRY, wanted
        self.task = asyncio.get_running_loop().create_task(self._update(wanted))

    async def _update(self, wanted: Record) -> None:
        node = self.node
        leader = node.addrs.get(node.leader_id or "")
        members = [m.addr for n, m in node.store.state.members.items() if n != node.id and m.status == "active"]
        _, addr_, store_port, ready, uid = wanted
        for addr in dict.fromkeys([a for a in [leader] if a] + self.seeds + members):
            try:
                reply = await self.transport.client(addr, timeout=5.0).join(node.id, addr_, store_port, ready, uid)
            except errors.PeerError as exc:
                log.info("membership update through %s failed: %s", addr, exc)
                continue
            if reply.accepted:
                log.info("membership updated through %s (leader %s, ready %s)", addr, reply.leader_id, ready)
                node.admitted_by = reply.leader_id
                node.join_seeds([m.addr for m in reply.members if m.node_id != node.id])
                node.chores_now()  # what we want may have changed while this was in flight
                return
