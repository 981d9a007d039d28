"""The states a box's job shows in its status (`job.state`, a public contract: docs/architecture.md
"Interfaces") and in the dpeer_job_state metric."""

from __future__ import annotations

from enum import StrEnum

from dpeer.statemachine.state import JobState


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
