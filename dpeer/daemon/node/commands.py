"""The node's commands: proposals, configuration changes and linearizable reads, each awaited
until the node applied it, and the operator's forced reconfiguration.

The futures of those waits live here; the driver resolves them as its Ready loop applies entries,
answers reads and changes role (applied, read_answered, not_leading).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from dpeer.consensus import NotLeader, Proposed, ReadRequested, Refused
from dpeer.consensus.ready import ProposeResult
from dpeer.consensus.voting import ChangeOp
from dpeer.errors import BadRequest, Unavailable
from dpeer.statemachine.entry import Entry
from dpeer.statemachine.payloads import Payload
from dpeer.statemachine.state import ApplyResult

if TYPE_CHECKING:
    from dpeer.daemon.node.driver import Node

log = logging.getLogger("dpeer.node")


class NodeCommands:
    """What RPCs and the leader's chores ask of the node; see the module docstring."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.forced = self.force_refused = 0
        self._waiters: dict[int, list[tuple[int, asyncio.Future]]] = {}
        self._reads: dict[int, asyncio.Future] = {}
        self._applied_waiters: list[tuple[int, asyncio.Future]] = []

    async def propose(self, payload: Payload, timeout: float) -> tuple[Entry, ApplyResult]:
        """Propose an entry as leader and wait until it is applied; Unavailable if it is not."""
        result = self.node.raft.propose(payload.KIND, payload.to_payload())
        return await self._wait_proposal(result, timeout)

    def removal_refusal(self, node: str) -> str | None:
        """Why removing voter `node` now would leave no live quorum (None: it would not)."""
        refused = self.node.raft.removal_refusal(node)
        return refused.reason if refused is not None else None

    async def change_membership(self, op: ChangeOp, node: str, uid: str, timeout: float) -> tuple[Entry, ApplyResult]:
        """Propose one single-server configuration change (uid: the store uid of a node being
        added) and wait until it is applied."""
        return await self._wait_proposal(self.node.raft.change_membership(op, node, uid), timeout)

    async def _wait_proposal(self, result: Any, timeout: float) -> tuple[Entry, ApplyResult]:
        if isinstance(result, NotLeader):
            raise Unavailable(f"not the leader (leader: {result.leader or 'unknown'})")
        if isinstance(result, Refused):
            raise BadRequest(f"refused: {result.reason}")
        assert isinstance(result, Proposed)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(result.index, []).append((result.term, fut))
        self.node.drain()
        try:
            same_term, entry, applied = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise Unavailable(f"entry {result.index} was not committed within {timeout:g}s (no quorum?)") from None
        if not same_term:
            raise Unavailable(f"leadership changed before entry {result.index} committed; try again")
        return entry, applied

    async def read_barrier(self, timeout: float) -> int:
        """ReadIndex: wait until a quorum confirmed leadership and the read index is applied."""
        result = self.node.raft.read_index()
        if isinstance(result, NotLeader):
            raise Unavailable(f"not the leader (leader: {result.leader or 'unknown'})")
        assert isinstance(result, ReadRequested)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._reads[result.request_id] = fut
        self.node.drain()
        try:
            index = await asyncio.wait_for(fut, timeout)
            await self.wait_applied(index, timeout)
        except asyncio.TimeoutError:
            self._reads.pop(result.request_id, None)
            raise Unavailable(f"leadership not confirmed by a quorum within {timeout:g}s") from None
        return index

    async def wait_applied(self, index: int, timeout: float) -> int:
        """Wait until last_applied >= index."""
        applied = self.node.reads.last_applied
        if applied >= index:
            return applied
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._applied_waiters.append((index, fut))
        return await asyncio.wait_for(fut, timeout)

    def force(self, voters: list[str]) -> ProposeResult:
        """UNSAFE operator recovery: make `voters` the whole voting configuration in a new
        cluster epoch and campaign, unless the core refuses (see consensus/force.py)."""
        node = self.node
        log.warning("FORCED reconfiguration requested by an operator: voters %s", voters)
        result = node.raft.force_new_configuration(node.clock(), voters, node.alive_voters(), node.wall())
        if isinstance(result, Refused):
            self.force_refused += 1
        else:
            self.forced += 1
        node.drain()
        return result

    # -- what the driver tells: entries applied, reads answered, leadership lost ----------
    def applied(self, entry: Entry, result: ApplyResult) -> None:
        """An entry was applied: answer whoever proposed it."""
        for term, fut in self._waiters.pop(entry.index, []):
            if not fut.done():
                fut.set_result((entry.term == term, entry, result))

    def applied_up_to(self, applied: int) -> None:
        """last_applied reached `applied`: release the waits for it."""
        keep = []
        for index, fut in self._applied_waiters:
            if index <= applied:
                if not fut.done():
                    fut.set_result(applied)
            else:
                keep.append((index, fut))
        self._applied_waiters = keep

    def read_answered(self, request_id: int, index: int) -> None:
        """The core confirmed a read's index."""
        fut = self._reads.pop(request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(index)

    def not_leading(self) -> None:
        """This node does not lead (any more): reads under way fail, to be tried again."""
        for fut in list(self._reads.values()):
            if not fut.done():
                fut.set_exception(Unavailable("leadership changed during the read; try again"))
        self._reads.clear()
