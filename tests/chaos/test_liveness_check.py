"""The chaos run's liveness check, as a table: a fault whose survivors never committed again is a
violation unless it hit once the job's last step was committed (a CI run killed n1 at step 2000
of 2000 and was failed for it)."""

from __future__ import annotations

import pytest

from dpeer.chaos.checks import check_liveness
from dpeer.chaos.schedule import Fault

STEPS, LIMIT = 2000, 60.0
LIVENESS = "training resumes after every fault (liveness)"


def fault(step_at: int, recovered_s: float | None, kind: str = "kill", old_gen_step: int = 0) -> Fault:
    return Fault(1, kind, ["n1"], 42.6, 4.5, step_at=step_at, recovered_s=recovered_s, back_s=2.5,
                 old_gen_step=old_gen_step)


@pytest.mark.parametrize("f, violations, why", [
    (fault(1990, 0.3), 0, "recovered at once"),
    (fault(1990, None), 1, "never committed again before the end: a violation"),
    (fault(1990, 61.0), 1, "recovered past the limit"),
    (fault(2000, None), 0, "the job's last step was committed already: no step can follow"),
    (fault(2001, None), 0, "past the last step too (a sample raced the end)"),
    # a CI run partitioned n3 (hook mode) at step 1950: the old group, Gloo still connected, finished the job
    (fault(1950, None, "partition", old_gen_step=2000), 0, "the old group committed the last step during the fault"),
    (fault(1950, None, "partition", old_gen_step=1990), 1, "the old group stopped short of the end: a violation"),
])
def test_liveness(f: Fault, violations: int, why: str) -> None:
    assert len(check_liveness([f], LIMIT, STEPS)[LIVENESS]) == violations, why


def test_a_node_not_back_is_a_violation_whatever_the_step() -> None:
    late = Fault(1, "kill", ["n1"], 42.6, 4.5, step_at=STEPS, recovered_s=None, back_s=None)
    assert check_liveness([late], LIMIT, STEPS)["every faulted node back in a group"]
