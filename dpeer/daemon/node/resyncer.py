"""Drives incremental resync: a heartbeat showing a higher committed version than ours makes
us fetch exactly the committed entries we miss from that peer, streamed in chunks.

The decision is the pure ResyncTracker's; this module only runs the fetch. A small gap is left
to the leader's normal replication, which is already in flight; a restarted or partitioned
node that is far behind pulls from whichever peer spoke first.
"""

from __future__ import annotations

import asyncio
import logging

from dpeer.consensus import Peer
from dpeer.errors import BadRequest, Behind, PeerError
from dpeer.membership import HeartbeatObserved
from dpeer.daemon.node.driver import Node
from dpeer.daemon.decide.resync_plan import FetchEntries, Nothing, ResyncPlan, ResyncTracker
from dpeer.transport.api import Transport

log = logging.getLogger("dpeer.resync")


class Resyncer:
    """Told each heartbeat (by the daemon's NodeEvents), runs at most one fetch at a time, counts what it fetched."""

    def __init__(self, node: Node, transport: Transport, min_gap: int = 16) -> None:
        self.node = node
        self.transport = transport
        self.min_gap = min_gap
        self.tracker = ResyncTracker()
        self.fetched_entries = 0
        self.fetches: list[dict[str, int | str]] = []
        self._task: asyncio.Task | None = None

    def on_heartbeat(self, seen: HeartbeatObserved) -> None:
        """Plan a fetch when a peer's committed version is ahead of ours by at least min_gap
        (from members of the configuration in force only, by node id and store uid)."""
        local = self.node.local_version
        if seen.hb.commit_index < local.last_applied + self.min_gap:
            return
        raft = self.node.raft
        member = raft.membership.is_member(seen.hb.node_id, raft.seen_uids.get(seen.hb.node_id, ""))
        self._start(self.tracker.observe(local, seen.hb, member))

    def _start(self, plan: ResyncPlan) -> None:
        if isinstance(plan, Nothing):
            return
        log.info("resync: %s", plan.reason)
        self._task = asyncio.get_running_loop().create_task(self._run(plan))

    async def _run(self, plan: FetchEntries) -> None:
        try:
            await self._fetch_entries(plan)
        except Behind:
            log.info("resync: %s compacted those entries; the leader will send its snapshot", plan.peer)
        except (PeerError, asyncio.TimeoutError) as exc:
            log.info("resync from %s stopped: %s", plan.peer, exc)
        finally:
            self._start(self.tracker.finished(self.node.local_version))

    async def _fetch_entries(self, plan: FetchEntries) -> None:
        addr = self.node.addrs.get(plan.peer)
        if addr is None:
            return
        client = self.transport.client(addr)
        got = 0
        async for chunk in client.fetch_entries(plan.from_index, plan.to_index, self.node.id):
            entries = list(chunk.entries)
            if not entries:
                continue
            sender = Peer(plan.peer, chunk.uid, chunk.epoch)
            try:
                if not self.node.accept_committed(entries, chunk.commit_index, sender, chunk.term):
                    break
            except BadRequest:
                break
            got += len(entries)
            self.fetched_entries += len(entries)
        self.fetches.append({"peer": plan.peer, "from": plan.from_index, "to": plan.to_index, "entries": got})
        log.info("resync: fetched %d entries [%d, %d] from %s", got, plan.from_index, plan.to_index, plan.peer)
