"""The job status a box shows (`job.state`): a script that reads the model on "finished" must find
it, so a box shows finished only once its own worker wrote the final model."""

from __future__ import annotations

import pytest

from dpeer.daemon.decide.job_status import JobStatus, status_of
from dpeer.statemachine.state import JobState

CASES = [
    # committed job state, worker wrote final.pt, worker runs the committed view -> status
    (JobState.RUNNING, False, False, JobStatus.WAITING),
    (JobState.RUNNING, False, True, JobStatus.TRAINING),
    (JobState.FAILED, False, True, JobStatus.FAILED),
    (JobState.FAILED, True, False, JobStatus.FAILED),
    (JobState.FINISHED, False, True, JobStatus.WAITING),   # finishing: committed, the file not yet written
    (JobState.FINISHED, False, False, JobStatus.WAITING),  # finishing: loads the final state from a holder
    (JobState.FINISHED, True, False, JobStatus.FINISHED),
]


@pytest.mark.parametrize(("committed", "done", "formed", "expected"), CASES)
def test_a_box_shows_finished_only_once_its_worker_wrote_the_final_model(
        committed: JobState, done: bool, formed: bool, expected: JobStatus) -> None:
    assert status_of(committed, done, formed) is expected


def test_the_states_are_the_public_contract_s_four() -> None:
    assert [s.value for s in JobStatus] == ["waiting", "training", "failed", "finished"]
