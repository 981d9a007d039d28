"""The worker link: everything between this box's worker and the node. It hands the worker what
committed entries changed (a view, a checkpoint, the job halted or running again), fences it
while no leader is known, tells the leader what the worker reports (worker/reports.py), fetches
the final state a finished job left (worker/final_state.py) and wakes the node's chores when the
worker rings its doorbell or exits (worker/wake.py).

It implements the supervisor's WorkerEvents, and is told of applied entries and chores by the
daemon, which routes the node's events (node/events.py NodeEvents) to it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from dpeer.consensus import Role
from dpeer.daemon.decide.checkpoints import Held
from dpeer.daemon.decide.failures import FailureReport
from dpeer.daemon.decide.job_status import job_document
from dpeer.daemon.node.driver import Node
from dpeer.daemon.node.leader_chores import LeaderChores
from dpeer.daemon.serve.metrics import Metrics
from dpeer.daemon.worker.final_state import FinalState
from dpeer.daemon.worker.reports import LeaderReports
from dpeer.daemon.worker.supervisor import Worker, WorkerSupervisor
from dpeer.daemon.worker.wake import WorkerWake
from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.payloads import ControlMode
from dpeer.statemachine.state import ApplyResult, JobState
from dpeer.transport.api import Transport

log = logging.getLogger("dpeer.daemon")


class WorkerLink:
    """This box's worker, linked to the node; see the module docstring."""

    def __init__(self, node: Node, transport: Transport, worker: Worker, leader: LeaderChores, metrics: Metrics,
                 ckpt_dir: Path) -> None:
        """leader: the leader's chores, the intake of our reports while we lead and what the
        status's `kept_out` reads; ckpt_dir: where the worker's checkpoints are."""
        self.node, self.worker, self.leader = node, worker, leader
        self.reports = LeaderReports(node, transport, worker, leader, metrics)
        self.final = FinalState(node, transport, worker, ckpt_dir)
        self.fence_after = 3 * node.raft_config.election_timeout_max
        self._leader_seen = node.clock()
        self._wake: WorkerWake | None = None
        self.rings = False  # the worker rings a doorbell on each report (ring(), worker_exited()): no polling
        worker.attach(self)
        state = node.reads.state
        if state.checkpoint is not None:
            worker.publish_checkpoint(state.checkpoint)
        if state.job.state is JobState.FAILED:
            worker.halt(state.job.error)

    def applied(self, entry: Entry, result: ApplyResult) -> None:
        """Hand the worker what a committed job, checkpoint or view entry changed."""
        if not result.accepted:
            return
        state = self.node.reads.state
        if entry.kind is EntryKind.JOB:
            if state.job.state is JobState.FAILED:
                self.worker.halt(state.job.error)
            else:
                self.worker.resume(self.node.clock())
        elif entry.kind is EntryKind.CHECKPOINT:
            self.worker.publish_checkpoint(state.checkpoint)
        elif entry.kind is EntryKind.VIEW and result.view is not None and result.view == state.view:
            self.worker.publish(result.view, state.checkpoint)  # not one a later entry of its batch replaced

    def chores(self, now: float) -> None:
        """Fence, read the worker's reports, tell the leader what it owes, fetch a final state."""
        self._fence(now)
        self.worker.poll(now)
        self.reports.missed_view(now)
        self._hand_pause()
        self.reports.checkpoint(now)
        self.final(now)

    def busy(self) -> bool:
        """The worker runs without a doorbell: its reports are only found by polling."""
        return not self.rings

    # -- WorkerEvents: what the worker tells us ------------------------------------------------
    def worker_failed(self, generation: int, report: FailureReport) -> None:
        """The worker's group (or its job's build) failed: tell the leader (directly when it is us)."""
        self.reports.failed(generation, report)

    def checkpoint_written(self, held: Held) -> None:
        """The worker wrote the checkpoint of `held.step`: report it until the log records one as new."""
        self.reports.checkpoint_written(held)

    def worker_spawned(self, pid: int) -> None:
        """A new worker process: watch for its exit."""
        if self._wake is not None:
            self._wake.watch_exit(pid)

    # -- the doorbell --------------------------------------------------------------------------
    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the chores at once when a real worker rings its doorbell or exits."""
        worker = self.worker
        if not isinstance(worker, WorkerSupervisor):
            return
        self._wake = WorkerWake.start(loop, str(worker.dir), self.ring, self.worker_exited)
        self.rings = self._wake is not None
        if self._wake is not None and worker.proc is not None:
            self._wake.watch_exit(worker.proc.pid)

    def ring(self) -> None:
        """The worker rang: run the chores at once (a report to act on)."""
        self.node.timers.chores_now()

    def worker_exited(self) -> None:
        """Notice the exit now, and keep the chores frequent so the restart comes on time."""
        self.node.timers.chores_now()
        self.node.timers.poke()

    # -- what the status shows -----------------------------------------------------------------
    def train_status(self) -> dict[str, Any] | None:
        """The status's `train`: the newest committed step the worker reported, or None."""
        train = self.worker.train
        return None if train is None else {"step": train.step, "samples": train.samples, "loss": train.loss,
                                           "params_digest": train.params_digest,
                                           "latest_step": self.worker.latest_step}

    def job_status(self) -> dict[str, Any]:
        """The status's `job` (see job_status.job_document)."""
        kept_out = self.leader.kept_out() if self.node.role is Role.LEADER else None
        return job_document(self.node.reads.state, self.node.id, self.worker, kept_out)

    # -- inside the chores ---------------------------------------------------------------------
    def _fence(self, now: float) -> None:
        """A node in the committed view that has known no leader for fence_after seconds is on
        the minority side (or alone): its worker stops, so two groups never train at once."""
        node = self.node
        if node.leader_id is not None:
            self._leader_seen = now
        view = node.reads.state.view
        in_view = view is not None and node.id in view.members
        silent = now - self._leader_seen
        if in_view and silent > self.fence_after:
            self.worker.fence(True, f"no leader for {silent:.1f}s: this node cannot reach a quorum", now)
        elif node.leader_id is not None:
            self.worker.fence(False, f"leader {node.leader_id} is reachable again", now)

    def _hand_pause(self) -> None:
        """Views are handed to the worker as they commit, so one started while training is paused
        (a restart, a crash, a retry) is handed the pause's empty view here, or it would wait for a
        view until its idle limit."""
        state, worker = self.node.reads.state, self.worker
        view = state.view
        if (state.control is ControlMode.PAUSED and view is not None and not view.members and worker.running
                and worker.given_generation < view.generation):
            worker.publish(view, state.checkpoint)

    def stop(self) -> None:
        """Stop the worker and what runs for it (the daemon shuts down)."""
        if self._wake is not None:
            self._wake.close()
        self.worker.stop()
        self.reports.cancel()
        if self.final.task is not None:
            self.final.task.cancel()
