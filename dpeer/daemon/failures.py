"""Whether a failing job is broken or only unlucky, as pure table-tested decisions.

A collective that fails because a peer died, hung or came late is transient: the group re-forms
and the step is redone. An exception that the job's own code (or the runtime around it) raises
outside a collective is a candidate for a broken job: when the same exception comes back at the
same step in `limit` consecutive attempts (generations for a step, worker starts for a build),
the leader halts the job with that reason instead of re-forming for ever. Re-forms of a failing
group back off, so a flapping job cannot burn the cluster's CPU.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

REPEAT_LIMIT = 3
BACKOFF_CAP = 10.0
ERROR_CHARS = 300


class FailurePhase(str, enum.Enum):
    """Where a failure came from; the value travels on the wire."""

    BUILD = "build"  # the job's build function raised (the worker never became ready)
    TRAIN = "train"  # the job's step, or the runtime around it, raised outside a collective
    GROUP = "group"  # a collective or the group's formation failed: a dead, hung or late peer


@dataclass(frozen=True)
class FailureReport:
    """One box's report of a failure. `attempt` tells attempts apart: the generation for a step's
    failure, the box's worker start count for a build's."""

    node: str
    phase: FailurePhase
    step: int
    error: str
    attempt: int


@dataclass(frozen=True)
class Streak:
    """Consecutive attempts that failed with one signature (phase, step, error)."""

    signature: tuple[FailurePhase, int, str] | None = None
    attempts: frozenset[tuple[str, int]] = frozenset()
    last: FailureReport | None = None


@dataclass(frozen=True)
class FailureVerdict:
    """The streak after a report, whether the job must halt, and why."""

    streak: Streak
    halt: bool
    reason: str


def one_line(text: str) -> str:
    """An error message as one line of at most ERROR_CHARS characters."""
    line = " ".join(text.split())
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 3] + "..."


def judge_failure(streak: Streak, report: FailureReport, limit: int = REPEAT_LIMIT) -> FailureVerdict:
    """Fold one report into the streak. Group failures never count (they are explained by a peer,
    not by the job); the same job exception at the same step in `limit` distinct attempts halts."""
    if report.phase is FailurePhase.GROUP:
        return FailureVerdict(streak, False, "a collective failed (a peer died, hung or was late): re-form")
    signature = (report.phase, report.step, report.error)
    key = (report.node, report.attempt) if report.phase is FailurePhase.BUILD else ("", report.attempt)
    attempts = streak.attempts | {key} if streak.signature == signature else frozenset({key})
    new = Streak(signature, attempts, report)
    count = len(attempts)
    where = "building the job" if report.phase is FailurePhase.BUILD else f"at step {report.step}"
    if count >= limit:
        return FailureVerdict(new, True, f"{report.error} ({where} on {report.node}; "
                                         f"the same failure {count} times in a row)")
    return FailureVerdict(new, False, f"{report.error} ({where} on {report.node}; {count} of {limit} before "
                                      "the job is halted)")


def reform_delay(failures_in_a_row: int, base: float, cap: float = BACKOFF_CAP) -> float:
    """How long a failed group waits before it is re-formed with the same members: `base` for the
    first failure, doubling for each further failure without progress, at most `cap`."""
    if failures_in_a_row <= 1:
        return base
    return min(cap, base * 2 ** (failures_in_a_row - 1))
