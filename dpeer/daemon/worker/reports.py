"""The worker's reports to the leader: a failed group or build, a view the worker was never
handed, and the checkpoints it holds, each told again on its own schedule until the leader acts.

A report goes straight to the leader's intake when this node leads, else over the transport to
the leader (a refused connection there is our own evidence that its process is gone).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from dpeer import errors
from dpeer.consensus import Role
from dpeer.daemon.decide.checkpoints import Held
from dpeer.daemon.decide.failures import FailurePhase, FailureReport
from dpeer.daemon.decide.worker_health import missed_view
from dpeer.daemon.node.driver import Node
from dpeer.daemon.node.events import LeaderIntake
from dpeer.daemon.serve.metrics import Metrics
from dpeer.daemon.worker.supervisor import Worker
from dpeer.transport.api import PeerClient, Transport
from dpeer.transport.calls import GroupFailedRequest

log = logging.getLogger("dpeer.daemon")
MISSED_VIEW_REPORT_EVERY = 1.0
CHECKPOINT_REPORT_EVERY, CHECKPOINT_REPORT_TRIES = 1.0, 30


class LeaderReports:
    """What this box's worker owes the leader; see the module docstring."""

    def __init__(self, node: Node, transport: Transport, worker: Worker, leader: LeaderIntake,
                 metrics: Metrics) -> None:
        self.node, self.transport, self.worker, self.leader, self.metrics = node, transport, worker, leader, metrics
        self._tasks: list[asyncio.Task] = []
        self._next_missed_report = 0.0
        self._failed: tuple[int, FailureReport] | None = None  # the worker's last group failure
        self._failure_told: str | None = None  # the leader the last failure report went to, or was checked with
        self._held: Held | None = None
        self._next_report, self._reports_left = 0.0, 0
        self._report_task: asyncio.Task | None = None

    def failed(self, generation: int, report: FailureReport) -> None:
        """The worker's group (or its job's build) failed: tell the leader (directly when it is us)."""
        last = self.worker.last_failure
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
        request = GroupFailedRequest(node_id=self.node.id, generation=generation, reason=report.error,
                                     phase=report.phase.value, step=report.step, error=report.error,
                                     attempt=report.attempt)
        self._tasks.append(asyncio.get_running_loop().create_task(
            self._tell_leader("the failure", lambda c: c.group_failed(request))))

    def missed_view(self, now: float) -> None:
        """While our worker waits on a committed view it was never handed, report that group failed
        (again each second: the report is lost while no leader is known), so a new generation
        re-forms it; after a full power loss or a lone box's worker crash nothing else would. Also
        repeat the worker's own report of the current generation's failure until a newer view
        comes: one report sent while no leader was known left the group waiting for good."""
        node, view = self.node, self.node.reads.state.view
        # a new leader knows nothing of a failure told to the old one (often the box that died):
        # tell it at once, so it need not wait for gossip's verdict and a full quiet window
        new_leader = node.leader_id is not None and node.leader_id != self._failure_told
        if view is None or (now < self._next_missed_report and not new_leader):
            return
        if self._failed is None or self._failed[0] != view.generation:
            self._failure_told = node.leader_id  # nothing for this leader to hear: check again when one is new
        verdict = missed_view(view.generation, node.id in view.members, self.worker.ready,
                              self.worker.given_generation)
        if verdict.hung:
            self._next_missed_report = now + MISSED_VIEW_REPORT_EVERY
            self.failed(view.generation, FailureReport(node.id, FailurePhase.GROUP, 0, verdict.reason,
                                                       view.generation))
        elif self._failed is not None and self._failed[0] == view.generation and self.worker.running:
            # the worker's group failed and it waits for the next view: the report is lost while no
            # leader is known (or on the way to one that died), so say it again until a view comes
            self._next_missed_report = now + MISSED_VIEW_REPORT_EVERY
            self._send_failure(*self._failed)

    def checkpoint_written(self, held: Held) -> None:
        """The worker wrote the checkpoint of `held.step`: report it until the log records one as new."""
        if self._held is None or held.step > self._held.step:
            self._held = held
            self._next_report, self._reports_left = 0.0, CHECKPOINT_REPORT_TRIES

    def checkpoint(self, now: float) -> None:
        """While the held checkpoint is newer than the committed one, tell the leader (again)."""
        committed = self.node.reads.state.checkpoint
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
            self.leader.checkpoint_reported(self.node.id, held)
        elif self._report_task is None or self._report_task.done():
            report = self._tell_leader(f"the checkpoint of step {held.step}", lambda c: c.report_checkpoint(
                self.node.id, held.step, held.digest, held.final))
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

    def cancel(self) -> None:
        """Cancel the reports under way (the daemon stops)."""
        for task in self._tasks + ([self._report_task] if self._report_task is not None else []):
            task.cancel()
