"""The states a box's job shows in its status (`job.state`, a public contract: docs/architecture.md
"Interfaces") and in the dpeer_job_state metric."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Mapping, Protocol

from dpeer.daemon.decide.failures import LastFailure
from dpeer.statemachine.state import ClusterState, JobState


class JobStatus(StrEnum):
    """What this box's job is doing, as its status says it."""

    WAITING = "waiting"    # not in a formed group yet (or finishing: the final model not yet written)
    TRAINING = "training"  # its worker trains in the committed view
    FAILED = "failed"      # the job failed everywhere (the committed reason says why); nothing restarts it
    FINISHED = "finished"  # the job finished and this box's worker wrote the final model


FINISHING = ("the job finished at step {step}; this box's worker has not yet written the final model "
             "(it ends its last step, or loads the final state from a holder)")


def status_of(committed: JobState, worker_done: bool, formed: bool) -> JobStatus:
    """This box's job status from the committed job state, whether its worker wrote the final
    model, and whether its worker runs the committed view: finished only once the file a script
    reads on "finished" exists on this box."""
    if committed is JobState.FAILED:
        return JobStatus.FAILED
    if committed is JobState.FINISHED:
        return JobStatus.FINISHED if worker_done else JobStatus.WAITING
    return JobStatus.TRAINING if formed else JobStatus.WAITING


class WorkerFacts(Protocol):
    """What job_document reads of the box's worker (daemon.supervisor.Worker has it all)."""

    done: bool
    given_generation: int
    last_failure: LastFailure | None

    @property
    def running(self) -> bool:
        """True while a worker process (or model) runs."""


def job_document(state: ClusterState, node_id: str, worker: WorkerFacts,
                 kept_out: Mapping[str, str] | None) -> dict[str, Any]:
    """The status's `job`: waiting, training, failed (with the reason) or finished (with the
    final step and digest, once this box's worker has written the final model; until then
    waiting, with what it waits for). kept_out: the leader's boxes kept out of the group (None elsewhere)."""
    job, view = state.job, state.view
    formed = (view is not None and node_id in view.members and worker.running
              and worker.given_generation == view.generation)
    status = status_of(job.state, worker.done, formed)
    if status is JobStatus.FAILED:
        return {"state": status, "error": job.error, "node": job.node, "step": job.step}
    if job.state is JobState.FINISHED:
        doc = {"state": status, "error": None, "step": job.step, "digest": job.digest}
        return doc if status is JobStatus.FINISHED else {**doc, "finishing": FINISHING.format(step=job.step)}
    last = worker.last_failure
    return {"state": status, "error": None, "last_failure": last.as_status() if last is not None else None,
            "kept_out": kept_out}
