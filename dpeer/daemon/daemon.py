"""`dpeer start`: one node's daemon: store, cores, gRPC server, leader chores, worker, signals.

Lifecycle: open the store (moving a corrupt one aside), found a cluster or resume or join,
serve, tell systemd READY=1 once this node is an active member, run until SIGTERM/SIGINT or
`dpeer leave`, then leave gracefully (a committed member_left) with the store flushed.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import signal
from typing import Any, Awaitable, Callable


from dpeer import errors
from dpeer.address import Address
from dpeer.clock import REAL, Clock
from dpeer.ids import SECRETS, Ids

from dpeer.security import exposure

from dpeer.daemon.decide.checkpoints import Held
from dpeer.daemon.decide.failures import FailurePhase, FailureReport
from dpeer.daemon.worker.final_state import fetch_final, holds
from dpeer.daemon.decide.job_status import job_document
from dpeer.daemon.config import NodeConfig
from dpeer.consensus import Role, bootstrap
from dpeer.daemon.node.leader_chores import LeaderChores
from dpeer.daemon.node.member_record import MemberRecordSync
from dpeer.daemon.serve.metrics import Metrics
from dpeer.daemon.node.driver import Node
from dpeer.daemon.notify import Notifier, watchdog_interval
from dpeer.daemon.node.resyncer import Resyncer
from dpeer.daemon.serve.service import Service
from dpeer.daemon.decide.sites import near_peers
from dpeer.daemon.serve.status import document, identity, tolerance
from dpeer.daemon.node.storage_adapter import StoreStorage
from dpeer.daemon.worker.supervisor import Worker, WorkerSupervisor
from dpeer.daemon.decide.worker_health import missed_view
from dpeer.daemon.worker.wake import WorkerWake
from dpeer.transport.api import PeerClient, Transport, TransportFactory
from dpeer.transport.grpc_transport import GrpcTransport
from dpeer.transport.options import Security
from dpeer.transport.server import serve
from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.membership import HeartbeatObserved
from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.payloads import ControlMode, decode
from dpeer.statemachine.state import ApplyResult, JobState, MemberStatus
from dpeer.statemachine.store import Store

log = logging.getLogger("dpeer.daemon")
LEAVE_TIMEOUT = 10.0
INTRODUCE_EVERY = 1.0
MISSED_VIEW_REPORT_EVERY = 1.0
CHECKPOINT_REPORT_EVERY, CHECKPOINT_REPORT_TRIES = 1.0, 30
FETCH_RETRY = 5.0


class Daemon:
    """Everything one `dpeer start` runs; built by run_daemon."""

    def __init__(
        self, config: NodeConfig, store: Store, security: Security, worker: Worker | None = None, *,
        transport: TransportFactory | None = None, clock: Clock = REAL, seed: int | None = None, ids: Ids = SECRETS,
    ) -> None:
        """transport: builds the network seam given where refusals go (default gRPC; the chaos
        entry and the simulation pass their own); clock: what every loop here reads; seed and
        ids: the node's randomness and the source of every random id it draws."""
        assert config.node_id is not None
        self.config, self.store, self.security, self.clock = config, store, security, clock
        self.node_id = config.node_id
        self.addr = config.advertise_addr
        self.metrics = Metrics(self.node_id)
        make = transport or (lambda refused: GrpcTransport(security, refused, on_rtt=self.metrics.rtt.observe))
        self.transport = make(self._refused)
        if store.last_index == 0 and store.snapshot_index == 0 and not config.join:
            bootstrap(StoreStorage(store), [self.node_id], uids={self.node_id: store.uid})
            log.info("founded a new cluster (store identity %s)", store.uid)
        self.node = Node(self.node_id, self.addr, store, self.transport.send, preset=config.preset,
                         max_voters=config.max_voters, timing=config.resolved_timing(), clock=clock, seed=seed,
                         events=self, ids=ids)
        self.resyncer = Resyncer(self.node, self.transport)
        self.worker = worker
        if worker is not None:
            worker.attach(self)
            if store.state.checkpoint is not None:
                worker.publish_checkpoint(store.state.checkpoint)
            if store.state.job.state is JobState.FAILED:
                worker.halt(store.state.job.error)
        self.site = config.site or ""
        self.leader = LeaderChores(self.node, config.resolved_timing().leader, self._store_port, self._ready,
                                   lambda: self.leaving, self._site, config.training.failure_repeats)
        self._wake: WorkerWake | None = None
        self.rings = False  # the worker rings a doorbell on each report (ring(), worker_exited()): no polling
        self.service = Service(self.node, self.transport, self.status, self._leave_done, self.leader.group_failed,
                               self.leader.checkpoint_reported, config.data_dir / "checkpoints")
        self.notifier = Notifier()
        self.started = clock.now()
        self.joined = False
        self._last_metrics = self._last_introduce = 0.0
        self.record = MemberRecordSync(self.node, self.transport, config.join, self._store_port, self._ready,
                                       self._site)
        self._reforms_counted = self._forced_counted = self._refused_counted = 0
        self._no_leader_note = ""
        self._leader_seen = self.node.clock()
        self.fence_after = 3 * self.node.raft_config.election_timeout_max
        self.leaving = False
        self._tasks: list[asyncio.Task] = []
        self._held: Held | None = None
        self._next_missed_report = 0.0
        self._failed: tuple[int, FailureReport] | None = None  # the worker's last group failure
        self._failure_told: str | None = None  # the leader the last failure report went to, or was checked with
        self._next_report, self._reports_left = 0.0, 0
        self._report_task: asyncio.Task | None = None
        self._fetch_task: asyncio.Task | None = None
        self._next_fetch = 0.0
        self.server: Any = None  # the gRPC server while run() serves

    def _refused(self, addr: str) -> None:
        self.node.refused(addr)

    def _store_port(self) -> int:
        """The port the worker bound for the rendezvous store it hosts as rank 0 (0: no worker)."""
        return self.worker.store_port if self.worker is not None else 0

    def _ready(self) -> bool:
        """Whether this node can train now: no job, or a worker that built it and waits."""
        return self.worker is None or self.worker.ready

    def _site(self) -> tuple[str, tuple[str, ...]]:
        """This box's configured site, or ("", the peers it measures near) when it names none."""
        if self.site:
            return self.site, ()
        me = self.node.store.state.members.get(self.node_id)
        samples = {n: rtts for n, rtts in self.node.probes.recent_ms().items() if n != self.node_id}
        return "", near_peers(samples, me.near if me is not None else ())

    # -- NodeEvents: what the node driver tells us ---------------------------------------------
    def chores(self, now: float) -> None:
        """Ours first, then the leader's: a failure report reaches the leader chores in the same pass."""
        self._chores(now)
        self.leader(now)

    def busy(self) -> bool:
        """Chores stay frequent while this node is not yet an active member, and while a worker
        runs without a doorbell (its reports are then only found by polling)."""
        return (self.worker is not None and not self.rings) or not self.joined or self.leaving

    def heartbeat(self, seen: HeartbeatObserved) -> None:
        """A peer's versions: maybe fetch what we miss."""
        self.resyncer.on_heartbeat(seen)

    def applied(self, entry: Entry, result: ApplyResult) -> None:
        """Hand the worker what a committed job, checkpoint or view entry changed."""
        if self.worker is not None and entry.kind is EntryKind.JOB and result.accepted:
            job = self.store.state.job
            if job.state is JobState.FAILED:
                self.worker.halt(job.error)
            else:
                self.worker.resume(self.node.clock())
        if self.worker is not None and entry.kind is EntryKind.CHECKPOINT and result.accepted:
            self.worker.publish_checkpoint(self.store.state.checkpoint)
        if self.worker is not None and entry.kind is EntryKind.VIEW and result.accepted:
            view = self.store.state.view
            if view is not None and view.generation == decode(entry.kind, entry.payload).generation:  # type: ignore[union-attr]
                self.worker.publish(view, self.store.state.checkpoint)

    # -- WorkerEvents: what the worker tells us ------------------------------------------------
    def worker_failed(self, generation: int, report: FailureReport) -> None:
        """The worker's group (or its job's build) failed: tell the leader (directly when it is us)."""
        last = self.worker.last_failure if self.worker is not None else None
        if report.phase is FailurePhase.TRAIN and last is not None:  # the job's own error: never quiet
            log.warning("the job failed at step %d (generation %d; %d time(s) in a row here): %s", report.step,
                        generation, last.repeats, report.error)
        elif report.phase is FailurePhase.GROUP:
            log.info("worker reports a group failure (generation %d, step %d): %s", generation, report.step,
                     report.error)
        self.metrics.failures.inc()
        if report.phase is not FailurePhase.BUILD:
            self._failed = (generation, report)
        self._send_failure(generation, report)

    def _send_failure(self, generation: int, report: FailureReport) -> None:
        """Tell the leader (directly when it is us) that a group or a build failed."""
        self._failure_told = self.node.leader_id
        if self.node.role is Role.LEADER:
            self.leader.group_failed(generation, report)
            return
        self._tasks = [t for t in self._tasks if not t.done()]
        request = pb.GroupFailedRequest(node_id=self.node_id, generation=generation, reason=report.error,
                                        phase=report.phase.value, step=report.step, error=report.error,
                                        attempt=report.attempt)
        self._tasks.append(asyncio.get_running_loop().create_task(
            self._tell_leader("the failure", lambda c: c.group_failed(request))))

    def _report_missed_view(self, now: float) -> None:
        """While our worker waits on a committed view it was never handed, report that group failed
        (again each second: the report is lost while no leader is known), so a new generation
        re-forms it; after a full power loss or a lone box's worker crash nothing else would. Also
        repeat the worker's own report of the current generation's failure until a newer view
        comes: one report sent while no leader was known left the group waiting for good."""
        assert self.worker is not None
        view = self.store.state.view
        # a new leader knows nothing of a failure told to the old one (often the box that died):
        # tell it at once, so it need not wait for gossip's verdict and a full quiet window
        new_leader = self.node.leader_id is not None and self.node.leader_id != self._failure_told
        if view is None or (now < self._next_missed_report and not new_leader):
            return
        if self._failed is None or self._failed[0] != view.generation:
            self._failure_told = self.node.leader_id  # nothing for this leader to hear: check again when one is new
        verdict = missed_view(view.generation, self.node_id in view.members, self.worker.ready,
                              self.worker.given_generation)
        if verdict.hung:
            self._next_missed_report = now + MISSED_VIEW_REPORT_EVERY
            self.worker_failed(view.generation, FailureReport(self.node_id, FailurePhase.GROUP, 0, verdict.reason,
                                                              view.generation))
        elif self._failed is not None and self._failed[0] == view.generation and self.worker.running:
            # the worker's group failed and it waits for the next view: the report is lost while no
            # leader is known (or on the way to one that died), so say it again until a view comes
            self._next_missed_report = now + MISSED_VIEW_REPORT_EVERY
            self._send_failure(*self._failed)

    def _hand_pause(self) -> None:
        """Views are handed to the worker as they commit, so one started while training is paused
        (a restart, a crash, a retry) is handed the pause's empty view here, or it would wait for a
        view until its idle limit."""
        assert self.worker is not None
        state, worker = self.store.state, self.worker
        view = state.view
        if (state.control is ControlMode.PAUSED and view is not None and not view.members and worker.running
                and worker.given_generation < view.generation):
            worker.publish(view, state.checkpoint)

    def checkpoint_written(self, held: Held) -> None:
        """The worker wrote the checkpoint of `held.step`: report it until the log records one as new."""
        if self._held is None or held.step > self._held.step:
            self._held = held
            self._next_report, self._reports_left = 0.0, CHECKPOINT_REPORT_TRIES

    def _take_final_state(self, now: float) -> None:
        """The job finished while this box was away: fetch the final checkpoint from a holder (again
        every FETCH_RETRY seconds while none serves it), then restart the worker to load it."""
        assert self.worker is not None
        job, ckpt = self.store.state.job, self.store.state.checkpoint
        if job.state is not JobState.FINISHED or ckpt is None or self.worker.done or now < self._next_fetch:
            return
        if self._fetch_task is not None and not self._fetch_task.done():
            return
        ckpt_dir = self.config.data_dir / "checkpoints"
        if holds(ckpt_dir, job.step, job.digest):
            return
        self._next_fetch = now + FETCH_RETRY
        sources = [(n, self.store.state.members[n].addr) for n in ckpt.holders
                   if n != self.node_id and n in self.store.state.members]
        self._fetch_task = asyncio.get_running_loop().create_task(self._fetch_final(job.step, job.digest, sources))

    async def _fetch_final(self, step: int, digest: str, sources: list[tuple[str, str]]) -> None:
        assert self.worker is not None
        log.info("the job finished at step %d while this box was away: fetching that state from %s",
                 step, ", ".join(n for n, _ in sources) or "nobody (no other holder)")
        source = await fetch_final(step, digest, sources, self.config.data_dir / "checkpoints", self.transport)
        if source is not None:
            self.worker.restart(self.node.clock(), f"load the final state of step {step} fetched from {source}")

    def _report_checkpoint(self, now: float) -> None:
        """While the held checkpoint is newer than the committed one, tell the leader (again)."""
        committed = self.store.state.checkpoint
        held = self._held
        if held is None or (committed is not None and committed.step >= held.step) or now < self._next_report:
            return
        if self._reports_left <= 0:
            log.info("the checkpoint of step %d was not recorded after %d reports (no majority of the group "
                     "holds it); the next checkpoint will be reported", held.step, CHECKPOINT_REPORT_TRIES)
            self._held = None
            return
        self._reports_left -= 1
        self._next_report = now + CHECKPOINT_REPORT_EVERY
        if self.node.role is Role.LEADER:
            self.leader.checkpoint_reported(self.node_id, held)
        elif self._report_task is None or self._report_task.done():
            report = self._tell_leader(f"the checkpoint of step {held.step}", lambda c: c.report_checkpoint(
                self.node_id, held.step, held.digest, held.final))
            self._report_task = asyncio.get_running_loop().create_task(report)

    async def _tell_leader(self, what: str, call: Callable[[PeerClient], Awaitable[object]]) -> None:
        """Make one call to the current leader over the transport; a failure is logged (the callers
        retry on their own schedule), and a refused connection is our own evidence that the
        leader's process is gone (node.refused)."""
        leader = self.node.addrs.get(self.node.leader_id or "")
        if leader is None:
            return
        try:
            await call(self.transport.client(leader, timeout=5.0))
        except errors.PeerError as exc:
            log.info("could not report %s to the leader: %s", what, exc)
            if isinstance(exc, errors.Unreachable) and exc.refused:
                self.node.refused(leader)

    def status(self) -> dict[str, Any]:
        """The status document (see status.document)."""
        train = self.worker.train if self.worker is not None else None
        extra = {
            "train": None if train is None else {"step": train.step, "samples": train.samples,
                                                 "loss": train.loss, "params_digest": train.params_digest,
                                                 "latest_step": self.worker.latest_step},
            "job": self.job_status(),
            "worker": self.worker.status() if self.worker is not None else None,
            "resync": {"fetched_entries": self.resyncer.fetched_entries, "fetches": self.resyncer.fetches[-10:]},
            "uptime_s": round(self.clock.now() - self.started, 3),
            "joined": self.joined,
            "security": self.security_status(),
        }
        return document(self.node, extra, self.site)

    def security_status(self) -> dict[str, Any]:
        """The status's `security`: the mode (mtls+token, mtls, token, none), --insecure,
        --insecure-data-plane, refusals so far."""
        server, s = self.server, self.config.security
        return {"mode": self.security.mode.value, "insecure": s.insecure, "insecure_data_plane": s.insecure_data_plane,
                "refused": sum(server.refusals.values()) if server is not None else 0}

    def job_status(self) -> dict[str, Any] | None:
        """The status's `job` (see job_status.job_document); None when this node runs no job."""
        if self.worker is None:
            return None
        kept_out = self.leader.kept_out() if self.node.role is Role.LEADER else None
        return job_document(self.store.state, self.node_id, self.worker, kept_out)

    # -- lifecycle ------------------------------------------------------------------------
    async def run(self) -> int:
        """Serve until told to stop (a signal or `dpeer leave`); returns exit code 0."""
        if self.config.metrics_listen:  # first: a busy metrics port must not leave a started gRPC server behind
            self.metrics.serve(self.config.metrics_listen, self.config.security)
        self.server = await serve(self.config.listen, self.service, self.security)
        log.info("listening on %s (advertised %s), security %s", self.config.listen, self.addr,
                 self.security.mode.value)
        s = self.config.security
        for warning in (exposure.warning(Address.parse(self.config.listen, any_port=True).host, self.security.mode,
                                         s.insecure),
                        exposure.data_plane_warning(self.config.store_bind[0], self.worker is not None, s.insecure,
                                                    s.insecure_data_plane)):
            if warning is not None:
                log.warning("%s", warning)
        self.metrics.insecure.set(1 if self.config.security.insecure else 0)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        if isinstance(self.worker, WorkerSupervisor):
            self._watch_worker(loop, self.worker)
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
        await self.node.run()

    def _watch_worker(self, loop: asyncio.AbstractEventLoop, worker: WorkerSupervisor) -> None:
        """Run the chores at once when the worker rings its doorbell or exits."""
        self._wake = WorkerWake.start(loop, str(worker.dir), self.ring, self.worker_exited)
        self.rings = self._wake is not None
        if self._wake is None:
            return
        if worker.proc is not None:
            self._wake.watch_exit(worker.proc.pid)

    def ring(self) -> None:
        """The worker rang: run the chores at once (a report to act on)."""
        self.node.chores_now()

    def worker_spawned(self, pid: int) -> None:
        """A new worker process: watch for its exit."""
        if self._wake is not None:
            self._wake.watch_exit(pid)

    def worker_exited(self) -> None:
        """Notice the exit now, and keep the chores frequent so the restart comes on time."""
        self.node.chores_now()
        self.node.poke()

    def _chores(self, now: float) -> None:
        if self.worker is not None:
            self._fence(now)
            self.worker.poll(now)
            self._report_missed_view(now)
            self._hand_pause()
            self._report_checkpoint(now)
            self._take_final_state(now)
        self.record(now, self.leaving)
        self._report_no_leader()
        member = self.store.state.members.get(self.node_id)
        if not self.joined and member is not None and member.status is MemberStatus.ACTIVE:
            self.joined = True
            log.info("joined the cluster as an active member")
            self.notifier.ready(f"member of a cluster of {len(self.store.state.members)}")
        if now - self._last_metrics >= 0.5:
            self._last_metrics = now
            self._update_metrics()
        if now - self._last_introduce >= INTRODUCE_EVERY:
            self._last_introduce = now
            self._introduce_committed_members()

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

    def _introduce_committed_members(self) -> None:
        """Push-pull with committed active members that gossip does not know (missed joins, reaped
        after a long partition), so the log's membership and gossip's converge."""
        unknown = [m.addr for n, m in self.store.state.members.items()
                   if m.status is MemberStatus.ACTIVE and n != self.node_id and self.node.swim.state_of(n) is None]
        if unknown:
            self.node.join_seeds(unknown)

    def _update_metrics(self) -> None:
        m, store = self.metrics, self.store
        m.set_members(collections.Counter(rec.state for rec in self.node.swim.members()))
        m.term.set(store.current_term)
        m.is_leader.set(1 if self.node.role is Role.LEADER else 0)
        m.commit_index.set(store.commit_index)
        m.last_applied.set(store.last_applied)
        m.invalid.set(self.node.invalid_messages)
        if self.server is not None:
            m.count_refusals(self.server.refusals)
        m.epoch.set(self.node.raft.epoch)
        m.strangers.set(len(self.node.raft.strangers()))
        held = tolerance(self.node)
        m.fault_tolerance.set(held["can_lose"] if held is not None else math.nan)
        m.forced.inc(self.node.forced - self._forced_counted)
        m.force_refused.inc(self.node.force_refused - self._refused_counted)
        self._forced_counted, self._refused_counted = self.node.forced, self.node.force_refused
        if self.worker is not None:
            if self.worker.train is not None:
                m.step.set(self.worker.train.step)
                m.samples.set(self.worker.train.samples)
            m.reforms.inc(self.worker.reforms - self._reforms_counted)
            self._reforms_counted = self.worker.reforms
            for seconds in self.worker.take_recoveries():
                m.recovery.observe(seconds)
        m.generation.set(store.state.view.generation if store.state.view else 0)
        m.paused.set(1 if store.state.control is ControlMode.PAUSED else 0)
        m.leaderless.set(0.0 if self.node.leader_id is not None else self.node.raft.leaderless_for(self.node.clock()))
        m.set_committed(store.state.members)
        m.kept_out.set(len(self.leader.kept_out()) if self.node.role is Role.LEADER else math.nan)
        m.set_data_dir(self.config.data_dir)
        job = self.job_status()
        m.set_job(job["state"] if job is not None else None)
        if self.notifier.enabled and watchdog_interval() is not None:
            self.notifier.watchdog()

    def _fence(self, now: float) -> None:
        """A node in the committed view that has known no leader for fence_after seconds is on
        the minority side (or alone): its worker stops, so two groups never train at once."""
        assert self.worker is not None
        if self.node.leader_id is not None:
            self._leader_seen = now
        view = self.store.state.view
        in_view = view is not None and self.node_id in view.members
        silent = now - self._leader_seen
        if in_view and silent > self.fence_after:
            self.worker.fence(True, f"no leader for {silent:.1f}s: this node cannot reach a quorum", now)
        elif self.node.leader_id is not None:
            self.worker.fence(False, f"leader {self.node.leader_id} is reachable again", now)

    def _on_signal(self, sig: int) -> None:
        log.info("received %s: leaving the cluster", signal.Signals(sig).name)
        asyncio.get_running_loop().create_task(self._graceful_leave())

    async def _graceful_leave(self) -> None:
        self.leaving = True
        self.notifier.stopping()
        try:
            await asyncio.wait_for(self.service.leave_cluster(), LEAVE_TIMEOUT)
        except (errors.PeerError, asyncio.TimeoutError) as exc:
            log.warning("could not commit the leave (%s); exiting anyway, the store is durable", exc)
            self.node.stop()

    async def _leave_done(self) -> None:
        """member_left is committed: gossip it briefly, then stop."""
        self._send_leave_gossip()
        asyncio.get_running_loop().create_task(self._stop_after(0.3))

    async def _stop_after(self, seconds: float) -> None:
        await self.clock.sleep(seconds)
        self.node.stop()

    def _send_leave_gossip(self) -> None:
        for addr, msg in self.node.swim.leave(self.node.clock()):
            self.transport.send(addr, self.node.envelope(msg))

    async def _shutdown(self) -> None:
        if self._wake is not None:
            self._wake.close()
        if self.worker is not None:
            self.worker.stop()
        for task in self._tasks + [t for t in (self.record.task, self._report_task, self._fetch_task) if t is not None]:
            task.cancel()
        if self.server is not None:
            await self.server.stop(grace=0.5)
        await self.transport.close()
        self.store.close()
        log.info("stopped; store closed")


def run_daemon(config: NodeConfig, worker: WorkerSupervisor | None = None,
               wrap: Callable[[Transport], Transport] | None = None) -> int:
    """`dpeer start` in the foreground; see dpeer.daemon.run.run_daemon (kept here for the CLI)."""
    from dpeer.daemon.run import run_daemon as run

    return run(config, worker, wrap)
