"""An operator's job commands, on the leader: retry a failed job, pause or resume training; each
refused while no member runs a job's worker."""

from __future__ import annotations

import logging

from dpeer.daemon.node.driver import Node
from dpeer.daemon.serve.backing import StatusSource
from dpeer.daemon.serve.forward import COMMAND_TIMEOUT
from dpeer.statemachine.payloads import ControlChange, ControlMode, JobChange
from dpeer.statemachine.state import JobState
from dpeer.transport.calls import JobControlReply

log = logging.getLogger("dpeer.service")


class JobControl:
    """The leader's side of `dpeer job retry|pause|resume`; see the module docstring."""

    def __init__(self, node: Node, status: StatusSource) -> None:
        """status: this daemon's status (its `job` is null when it runs no worker)."""
        self.node, self.status = node, status

    def _no_job(self, action: str) -> JobControlReply | None:
        """A refusal when no member runs a job's worker: this leader runs none, and no member's
        record carries the store port a job's worker binds."""
        state = self.node.reads.state
        if (state.job.state is JobState.RUNNING and self.status.status().get("job") is None
                and not any(m.store_port for m in state.members.values())):
            return JobControlReply(accepted=False, reason=f"there is no job to {action}: no member of this "
                                      "cluster runs a job's worker (nodes run one with --job)")
        return None

    async def retry(self) -> JobControlReply:
        """Commit a failed job as running again."""
        job = self.node.reads.state.job
        if (refused := self._no_job("retry")) is not None:
            return refused
        if job.state is not JobState.FAILED:
            return JobControlReply(accepted=False, reason=f"the job is {job.state.value}, not failed")
        entry, result = await self.node.commands.propose(JobChange(JobState.RUNNING), COMMAND_TIMEOUT)
        if not result.accepted:
            return JobControlReply(accepted=False, reason=result.reason, index=entry.index)
        log.warning("the job was retried by an operator after: %s", job.error)
        return JobControlReply(accepted=True, reason=f"retrying after: {job.error}", index=entry.index)

    async def control(self, mode: ControlMode) -> JobControlReply:
        """Commit a pause or a resume; the leader's next view ends the group or forms it again."""
        state, pausing = self.node.reads.state, mode is ControlMode.PAUSED
        if (refused := self._no_job("pause" if pausing else "resume")) is not None:
            return refused
        if state.control is mode:
            return JobControlReply(accepted=False, reason=f"training is already {mode.value}")
        if pausing and state.job.state is not JobState.RUNNING:
            return JobControlReply(accepted=False, reason=f"the job is {state.job.state.value}: nothing trains")
        entry, result = await self.node.commands.propose(ControlChange(mode), COMMAND_TIMEOUT)
        if not result.accepted:
            return JobControlReply(accepted=False, reason=result.reason, index=entry.index)
        self.node.timers.poke()
        self.node.timers.chores_now()  # the leader's next view (empty, or the group again) is due now
        log.warning("training was %s by an operator", "paused" if pausing else "resumed")
        reason = ("training is paused: every worker stops at its next step and holds its state until "
                  "`dpeer job resume`" if pausing else "training resumes from the step it paused at")
        return JobControlReply(accepted=True, reason=reason, index=entry.index)
