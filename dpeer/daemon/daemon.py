"""`dpeer start`: one node's daemon, assembled from its owners, and its lifecycle.

The owners, each with one job: the node runtime (node/: the driver with its loop, commands and
reads, the leader's chores, the resync, this box's member record and upkeep), the worker link
(worker/link.py: the supervisor, its reports, fencing, the final state) and the RPC service with
its backing (serve/: the service, the status report, the metrics feed). The daemon builds them,
routes the node's events (node/events.py NodeEvents) to them, and runs the lifecycle: serve, tell
systemd READY=1 once this node is an active member, run until SIGTERM/SIGINT or `dpeer leave`,
then leave gracefully (a committed member_left) with the store flushed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Callable

from dpeer import errors
from dpeer.address import Address
from dpeer.clock import REAL, Clock
from dpeer.consensus import bootstrap
from dpeer.daemon.config import NodeConfig
from dpeer.daemon.node.driver import Node
from dpeer.daemon.node.leader_chores import LeaderChores
from dpeer.daemon.node.record_sync import MemberRecordSync
from dpeer.daemon.node.resyncer import Resyncer
from dpeer.daemon.node.storage_adapter import StoreStorage
from dpeer.daemon.node.this_box import ThisBox
from dpeer.daemon.node.upkeep import NodeUpkeep
from dpeer.daemon.notify import Notifier
from dpeer.daemon.serve.backing import Backing
from dpeer.daemon.serve.metrics import Metrics
from dpeer.daemon.serve.metrics_feed import MetricsFeed
from dpeer.daemon.serve.site_bytes import Connections, SiteBytes
from dpeer.daemon.serve.service import Service
from dpeer.daemon.serve.status_report import StatusReport
from dpeer.daemon.worker.link import WorkerLink
from dpeer.daemon.worker.supervisor import Worker, WorkerSupervisor
from dpeer.ids import SECRETS, Ids
from dpeer.membership import HeartbeatObserved
from dpeer.security import exposure
from dpeer.statemachine.entry import Entry
from dpeer.statemachine.state import ApplyResult
from dpeer.statemachine.store import Store
from dpeer.transport.api import Transport, TransportFactory
from dpeer.transport.grpc_transport import GrpcTransport
from dpeer.transport.options import Security
from dpeer.transport.server import serve

log = logging.getLogger("dpeer.daemon")
LEAVE_TIMEOUT = 10.0


class Daemon:
    """Everything one `dpeer start` runs; built by run_daemon. See the module docstring."""

    def __init__(
        self, config: NodeConfig, store: Store, security: Security, worker: Worker | None = None, *,
        transport: TransportFactory | None = None, clock: Clock = REAL, seed: int | None = None, ids: Ids = SECRETS,
        connections: Connections | None = None,
    ) -> None:
        """transport: builds the network seam given where refusals go (default gRPC; the chaos
        entry and the simulation pass their own); clock: what every loop here reads; seed and
        ids: the node's randomness and the source of every random id it draws; connections: reads
        the kernel's TCP connections to count the bytes crossing sites (a real process's; the
        simulation's daemons have none)."""
        assert config.node_id is not None
        self.config, self.store, self.security, self.clock = config, store, security, clock
        self.metrics = metrics = Metrics(config.node_id)
        make = transport or (lambda refused: GrpcTransport(security, refused, on_rtt=metrics.rtt.observe))
        self.transport = make(self._refused)
        if store.last_index == 0 and store.snapshot_index == 0 and not config.join:
            bootstrap(StoreStorage(store), [config.node_id], uids={config.node_id: store.uid})
            log.info("founded a new cluster (store identity %s)", store.uid)
        timing = config.resolved_timing()
        self.node = node = Node(config.node_id, config.advertise_addr, store, self.transport.send,
                                preset=config.preset, max_voters=config.max_voters, timing=timing, clock=clock,
                                seed=seed, events=self, ids=ids)
        self.resyncer = Resyncer(node, self.transport)
        self.box = ThisBox(node, worker, config.site or "", config.training.split == "speed")
        # the job's step from the config of a box that runs it; a box that runs no job may have any
        # training config (the defaults most often), so its leader takes every change of shares
        self.leader = LeaderChores(node, timing.leader, self.box, config.training.failure_repeats,
                                   config.training.step_units if worker is not None else None)
        ckpt_dir = config.data_dir / "checkpoints"
        self.link = None if worker is None else WorkerLink(node, self.transport, worker, self.leader, metrics,
                                                           ckpt_dir)
        self.notifier = Notifier()
        self.record = MemberRecordSync(node, self.transport, config.join, self.box)
        self.upkeep = NodeUpkeep(node, self.record, self.notifier)
        self.site_bytes = None if connections is None else SiteBytes(node, self.link, connections)
        self.report = StatusReport(node, config, security, self.link, self.resyncer, self.upkeep, clock,
                                   self.site_bytes)
        self.feed = MetricsFeed(metrics, node, self.leader, self.report, self.notifier)
        self.service = Service(node, self.transport, Backing(self.report, self.leader, self, ckpt_dir))

    def _refused(self, addr: str) -> None:
        self.node.refused(addr)

    # -- NodeEvents: what the node driver tells us, routed to the owners -------------------------
    def chores(self, now: float) -> None:
        """The worker link's, the node's upkeep, the metrics, then the leader's: a failure report
        reaches the leader chores in the same pass."""
        if self.link is not None:
            self.link.chores(now)
        self.upkeep(now)
        self.feed(now)
        self.leader(now)

    def busy(self) -> bool:
        """Chores stay frequent while this node is not yet an active member, and while a worker
        runs without a doorbell (its reports are then only found by polling)."""
        return (self.link is not None and self.link.busy()) or not self.upkeep.joined or self.box.leaving

    def heartbeat(self, seen: HeartbeatObserved) -> None:
        """A peer's versions: maybe fetch what we miss."""
        self.resyncer.on_heartbeat(seen)

    def applied(self, entry: Entry, result: ApplyResult) -> None:
        """Hand the worker what a committed job, checkpoint or view entry changed."""
        if self.link is not None:
            self.link.applied(entry, result)

    # -- lifecycle ------------------------------------------------------------------------
    async def run(self) -> int:
        """Serve until told to stop (a signal or `dpeer leave`); returns exit code 0."""
        config, s = self.config, self.config.security
        if config.metrics_listen:  # first: a busy metrics port must not leave a started gRPC server behind
            self.metrics.serve(config.metrics_listen, s)
        self.report.server = await serve(config.listen, self.service, self.security)
        log.info("listening on %s (advertised %s), security %s", config.listen, config.advertise_addr,
                 self.security.mode.value)
        for warning in (exposure.warning(Address.parse(config.listen, any_port=True).host, self.security.mode,
                                         s.insecure),
                        exposure.data_plane_warning(config.store_bind[0], self.link is not None, s.insecure,
                                                    s.insecure_data_plane)):
            if warning is not None:
                log.warning("%s", warning)
        self.metrics.insecure.set(1 if s.insecure else 0)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        if self.link is not None:
            self.link.watch(loop)
        try:
            await self.run_node()
        finally:
            await self._shutdown()
        return 0

    async def run_node(self) -> None:
        """The node's part of run(), without a server or signals (what the simulation runs):
        the chores, the join through the seeds, the driver's loop until stop()."""
        if self.config.join:
            self.node.join_seeds(self.config.join)
        await self.node.timers.run()

    def _on_signal(self, sig: int) -> None:
        log.info("received %s: leaving the cluster", signal.Signals(sig).name)
        asyncio.get_running_loop().create_task(self._graceful_leave())

    async def _graceful_leave(self) -> None:
        self.box.leaving = True
        self.notifier.stopping()
        try:
            await asyncio.wait_for(self.service.leave_cluster(), LEAVE_TIMEOUT)
        except (errors.PeerError, asyncio.TimeoutError) as exc:
            log.warning("could not commit the leave (%s); exiting anyway, the store is durable", exc)
            self.node.timers.stop()

    async def left(self) -> None:
        """member_left is committed: gossip it briefly, then stop (serve/backing.py Lifecycle)."""
        node = self.node
        for addr, msg in node.swim.leave(node.clock()):
            self.transport.send(addr, node.envelope(msg))
        asyncio.get_running_loop().create_task(self._stop_after(0.3))

    async def _stop_after(self, seconds: float) -> None:
        await self.clock.sleep(seconds)
        self.node.timers.stop()

    async def _shutdown(self) -> None:
        if self.link is not None:
            self.link.stop()
        if self.record.task is not None:
            self.record.task.cancel()
        if self.report.server is not None:
            await self.report.server.stop(grace=0.5)
        await self.transport.close()
        if self.site_bytes is not None:
            self.site_bytes.close()
        self.store.close()
        log.info("stopped; store closed")


def run_daemon(config: NodeConfig, worker: WorkerSupervisor | None = None,
               wrap: Callable[[Transport], Transport] | None = None) -> int:
    """`dpeer start` in the foreground; see dpeer.daemon.run.run_daemon (kept here for the CLI)."""
    from dpeer.daemon.run import run_daemon as run

    return run(config, worker, wrap)
