"""Keep this box's own committed member record (address, store port, readiness, store identity,
site, near peers and speed class) in line with what it is now, through the leader or the seeds; the first such
update is the join.

One update in flight at a time (its requests go to a known leader alone, else to the seeds and
members in turn, see _update). The same update goes again only after JOIN_RETRY (the last one
may still be on its way into our log); a different one goes at once, so a worker that became
ready while the last update was in flight is trained with without waiting out the retry.
Each daemon start (its boot) sends one update even when the record is current, until one is
accepted: the leader judges every boot's first update, so a copy of a member's disk (same node id,
same store) is told to stop though its record reads as the original's.

A refusal (BadRequest: the record as it stands is wrong, such as a node id another live box
holds) told REFUSALS_TO_STOP times in a row stops the daemon with that sentence (`refusal`;
`dpeer start` prints it and exits 2) instead of asking again for ever.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, Sequence

from dpeer import errors
from dpeer.consensus import Role
from dpeer.daemon.node.driver import Node
from dpeer.statemachine.state import MemberStatus
from dpeer.transport.api import Transport
from dpeer.transport.calls import JoinReply

log = logging.getLogger("dpeer.daemon")
JOIN_RETRY = 0.5
ROUND = 5.0  # one update's bound, as one client timeout was
HEDGE = 0.25  # seconds without an answer before the next address is tried too
REFUSALS_TO_STOP = 3
# status, address, store port, ready, store uid, configured site, near peers, speed class
Record = tuple[str, str, int, bool, str, str, tuple[str, ...], int | None]


class Box(Protocol):
    """What this box is now, as its member record should say (node/this_box.py is the daemon's):
    read by the record's sync and by the leader's chores for the leader's own record."""

    leaving: bool  # the daemon is leaving: its record is no longer kept up

    def store_port(self) -> int:
        """The port the worker bound for the rendezvous store it hosts as rank 0 (0: no worker)."""

    def ready(self) -> bool:
        """Whether this box can train now: no job, or a worker that built it and waits."""

    def site(self) -> tuple[str, tuple[str, ...]]:
        """This box's configured site, or ("", the peers it measures near) (daemon/decide/sites.py)."""

    def speed_class(self) -> int | None:
        """This box's speed class from its worker's latest speed (None: unknown; daemon/decide/speeds.py)."""


class MemberRecordSync:
    """Called from the daemon's chores; see the module docstring."""

    def __init__(self, node: Node, transport: Transport, seeds: Sequence[str], box: Box) -> None:
        self.node, self.transport, self.seeds, self.box = node, transport, list(seeds), box
        self.task: asyncio.Task | None = None
        self._next = 0.0
        self._sent: Record | None = None  # the record the last update asked for
        self.refusal: str | None = None  # why the cluster keeps refusing us, once we stopped on it
        self._refused: tuple[str, int] = ("", 0)  # the last refusal and how many times in a row
        self.confirmed = False  # an update of this boot was accepted (the leader judged it)

    def wanted(self) -> Record:
        """Our member record as it should read now."""
        box = self.box
        return (MemberStatus.ACTIVE, self.node.addr, box.store_port(), box.ready(), self.node.reads.uid, *box.site(),
                box.speed_class())

    def __call__(self, now: float) -> None:
        """Start an update if our record is out of date and we do not lead (nor leave)."""
        if (self.node.role is Role.LEADER or self.box.leaving or self.refusal is not None
                or (self.task is not None and not self.task.done())):
            return
        member = self.node.reads.state.members.get(self.node.id)
        wanted = self.wanted()
        current = member is not None and (member.status, member.addr, member.store_port, member.ready,
                                          member.uid, member.site, member.near, member.speed_class) == wanted
        if current and self.confirmed:
            return
        if now < self._next and wanted == self._sent:
            return
        self._next, self._sent = now + JOIN_RETRY, wanted
        self.task = asyncio.get_running_loop().create_task(self._update(wanted))

    def _targets(self, leader: str | None) -> list[str]:
        """Where an update may go, best first: the leader, the seeds, then the active members."""
        node = self.node
        members = [m.addr for n, m in node.reads.state.members.items()
                   if n != node.id and m.status is MemberStatus.ACTIVE]
        return list(dict.fromkeys([a for a in [leader] if a] + self.seeds + members))

    async def _update(self, wanted: Record) -> None:
        """Send the update until one address accepts it or ROUND passes. A known leader is asked
        alone while it has not answered (another address would only forward a second request to
        it). Otherwise the next address is tried too when the last has not answered within HEDGE
        (a starting peer that knows no leader holds a request for seconds), and an address that
        failed is tried again after JOIN_RETRY (a seed that refused us may have been a moment
        from listening)."""
        leader = self.node.addrs.get(self.node.leader_id or "")
        clock, order = self.node.clock, self._targets(leader)
        deadline = clock() + ROUND
        due = dict.fromkeys(order, clock())  # when each address may next be tried
        flying: dict[asyncio.Task, str] = {}
        try:
            while (now := clock()) < deadline and order:
                wake = self._start_next(order, due, flying, leader, wanted, now, deadline)
                if not flying:
                    await asyncio.sleep(max(0.0, wake - now))
                    continue
                done, _ = await asyncio.wait(flying, timeout=max(0.0, wake - now), return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    addr, reply = flying.pop(task), task.result()
                    if isinstance(reply, JoinReply) and reply.accepted:
                        self._admitted(addr, reply, wanted[3])
                        return
                    if isinstance(reply, str) and self._stop_on(reply):
                        return
                    due[addr] = clock() + JOIN_RETRY
        finally:
            for task in flying:
                task.cancel()

    def _start_next(self, order: list[str], due: dict[str, float], flying: dict[asyncio.Task, str],
                    leader: str | None, wanted: Record, now: float, deadline: float) -> float:
        """Start a request to the next address that may be tried now, if any; when to look again."""
        if leader is not None and leader in flying.values():
            return deadline
        idle = [a for a in order if a not in flying.values()]
        free = [a for a in idle if due[a] <= now]
        if not free:
            return min([due[a] for a in idle] + [deadline])
        flying[asyncio.create_task(self._try(free[0], wanted, deadline - now))] = free[0]
        return deadline if free[0] == leader else now + HEDGE

    async def _try(self, addr: str, wanted: Record, timeout: float) -> JoinReply | str | None:
        """The reply, the sentence of a refusal, or None when the update did not get through."""
        _, addr_, store_port, ready, uid, site, near, speed_class = wanted
        node = self.node
        try:
            return await self.transport.client(addr, timeout=timeout).join(
                node.id, addr_, store_port, ready, uid, node.boot, node.clock() - node.started, site, near,
                speed_class)
        except errors.BadRequest as exc:
            log.warning("membership update through %s refused: %s", addr, exc)
            return str(exc)
        except errors.PeerError as exc:
            log.info("membership update through %s failed: %s", addr, exc)
            return None

    def _stop_on(self, refusal: str) -> bool:
        """Count a refusal; the same one REFUSALS_TO_STOP times in a row stops the daemon (True)."""
        last, times = self._refused
        times = times + 1 if refusal == last else 1
        self._refused = (refusal, times)
        if times < REFUSALS_TO_STOP:
            return False
        self.refusal = refusal
        log.error("stopping: the cluster refused this box's membership %d times in a row: %s", times, refusal)
        self.node.timers.stop()
        return True

    def _admitted(self, addr: str, reply: JoinReply, ready: bool) -> None:
        node = self.node
        self._refused, self.confirmed = ("", 0), True
        log.info("membership updated through %s (leader %s, ready %s)", addr, reply.leader_id, ready)
        node.admitted_by = reply.leader_id
        node.join_seeds([m.addr for m in reply.members if m.node_id != node.id])
        node.timers.chores_now()  # what we want may have changed while this was in flight
