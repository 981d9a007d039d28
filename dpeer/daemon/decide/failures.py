"""Whether a failing job is broken or only unlucky, as pure table-tested decisions.

A collective that fails because a peer died, hung or came late is transient: the group re-forms
and the step is redone. An exception that the job's own code (or the runtime around it) raises
outside a collective is a candidate for a broken job. Failures are compared by their signature:
the phase, the step and the error with its figures folded (digits, hex ids, addresses), so an
error naming a free-memory figure, a PID or a port that differs on each try still repeats.

A step's failure is the group's: the same signature in `limit` consecutive generations halts the
job. A build's failure is one box's: that box, once its build failed `limit` times in a row, is
kept out of the group (it never becomes ready), and the job halts only when every box that could
train is such a box, so one misconfigured box never stops a group that trains without it. Re-forms
of a failing group back off, so a flapping job cannot burn the cluster's CPU.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, Mapping

REPEAT_LIMIT = 3
BACKOFF_CAP = 10.0
ERROR_CHARS = 300
# Hex tokens holding a digit (ids, digests, pointers, 0x addresses), then any digit run left, then
# the separators between folded figures (an IPv4 address and port, a time, a decimal) become one "#".
_HEX = re.compile(r"\b(?:0x)?[0-9a-f]*[0-9][0-9a-f]*\b", re.IGNORECASE)
_DIGITS = re.compile(r"[0-9]+")
_JOINED = re.compile(r"#(?:[.:,_/-]+#)+")


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
    """Consecutive attempts that failed with one signature (phase, step, folded error)."""

    signature: tuple[FailurePhase, int, str] | None = None
    attempts: frozenset[tuple[str, int]] = frozenset()
    last: FailureReport | None = None


@dataclass(frozen=True)
class FailureVerdict:
    """The streak after a report, whether the job must halt, and why."""

    streak: Streak
    halt: bool
    reason: str


@dataclass(frozen=True)
class BuildVerdict:
    """Every box's build streak after a report, whether the job must halt, why, and the boxes
    kept out of the group because their build failed `limit` times in a row (box -> reason)."""

    streaks: Mapping[str, Streak]
    halt: bool
    reason: str
    kept_out: Mapping[str, str]


@dataclass(frozen=True)
class LastFailure:
    """A box's newest failure of the job's own code (build or step) and how many of its reports
    in a row had that signature: what `dpeer status --json` shows while the job is not halted."""

    report: FailureReport
    repeats: int

    def as_status(self) -> dict[str, Any]:
        """The status's `job.last_failure`."""
        r = self.report
        return {"phase": r.phase.value, "step": r.step, "error": r.error, "repeats": self.repeats}


def one_line(text: str) -> str:
    """An error message as one line of at most ERROR_CHARS characters."""
    line = " ".join(text.split())
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 3] + "..."


def fold(error: str) -> str:
    """The error with the figures that differ between tries of one failure folded to "#": digits,
    hex ids and addresses, so "512 MiB free" and "497 MiB free" (or two PIDs, ports) compare equal."""
    return _JOINED.sub("#", _DIGITS.sub("#", _HEX.sub("#", one_line(error))))


def signature(report: FailureReport) -> tuple[FailurePhase, int, str]:
    """What two reports share when they are the same failure: phase, step (0 for a build) and folded error."""
    return report.phase, report.step if report.phase is not FailurePhase.BUILD else 0, fold(report.error)


def _extend(streak: Streak, report: FailureReport) -> Streak:
    """The streak with one more report: counted once per attempt, restarted by another signature."""
    key = (report.node, report.attempt) if report.phase is FailurePhase.BUILD else ("", report.attempt)
    sig = signature(report)
    attempts = streak.attempts | {key} if streak.signature == sig else frozenset({key})
    return Streak(sig, attempts, report)


def judge_failure(streak: Streak, report: FailureReport, limit: int = REPEAT_LIMIT) -> FailureVerdict:
    """Fold one report into the group's streak. Group failures never count (they are explained by
    a peer, not by the job); the same job exception at the same step in `limit` distinct
    generations halts. A build's report counts like a step's here; judge_build says who halts it."""
    if report.phase is FailurePhase.GROUP:
        return FailureVerdict(streak, False, "a collective failed (a peer died, hung or was late): re-form")
    new = _extend(streak, report)
    count = len(new.attempts)
    where = "building the job" if report.phase is FailurePhase.BUILD else f"at step {report.step}"
    if count >= limit:
        return FailureVerdict(new, True, f"{report.error} ({where} on {report.node}; "
                                         f"the same failure {count} times in a row)")
    return FailureVerdict(new, False, f"{report.error} ({where} on {report.node}; {count} of {limit} before "
                                      "the job is halted)")


def judge_build(
    streaks: Mapping[str, Streak], report: FailureReport, could_train: Mapping[str, bool], limit: int = REPEAT_LIMIT,
) -> BuildVerdict:
    """Fold one box's failed build into the per-box streaks and decide.

    `could_train` holds every box of the cluster that has not left, with whether its worker has
    built the job (ready). A box that failed its build `limit` times in a row is kept out of the
    group; the job halts only when every box that could train (these boxes and any that reported)
    is kept out so: none has built the job, none is still building it for the first time, and no
    box that is away (dead) could come back and train. A box that built since drops its streak;
    the reporter has not built it, whatever its (older) member record says."""
    ready = {**could_train, report.node: False}
    kept = {n: s for n, s in streaks.items() if ready.get(n) is False}
    kept[report.node] = _extend(streaks.get(report.node, Streak()), report)
    count = len(kept[report.node].attempts)
    out = {n: s.last.error for n, s in kept.items() if len(s.attempts) >= limit and s.last is not None}
    where = f"building the job on {report.node}"
    if count < limit:
        return BuildVerdict(kept, False, f"{report.error} ({where}; {count} of {limit} before the box is kept "
                                         "out of the group)", out)
    boxes = sorted(ready)
    if all(b in out for b in boxes):
        return BuildVerdict(kept, True, f"{report.error} ({where}; the same failure {count} times in a row; "
                                        f"no box can build it: {', '.join(boxes)})", out)
    trains = [b for b in boxes if ready[b]]
    building = [b for b in boxes if b not in out and b not in trains]
    others = f"{', '.join(trains)} can train without it" if trains else f"{', '.join(building)} may still build it"
    return BuildVerdict(kept, False, f"{report.error} ({where}; the same failure {count} times in a row): "
                                     f"{report.node} is kept out of the group; {others}", out)


def note_failure(last: LastFailure | None, report: FailureReport) -> LastFailure | None:
    """A box's newest failure after one more report: the repeat count grows while the signature
    stays the same. Group failures (a peer's doing) leave it as it was."""
    if report.phase is FailurePhase.GROUP:
        return last
    same = last is not None and signature(last.report) == signature(report)
    return LastFailure(report, last.repeats + 1 if same and last is not None else 1)


def reform_delay(failures_in_a_row: int, base: float, cap: float = BACKOFF_CAP) -> float:
    """How long a failed group waits before it is re-formed with the same members: `base` for the
    first failure, doubling for each further failure without progress, at most `cap`."""
    if failures_in_a_row <= 1:
        return base
    return min(cap, base * 2 ** (failures_in_a_row - 1))
