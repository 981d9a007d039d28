"""The fields of the worker's reports as the supervisor takes them: the group generation a report
names, a failure as the report the leader judges, and the status's train fields. A worker is
semi-trusted input (it runs the user's code): what does not parse is taken as nothing, or raises
KeyError, TypeError or ValueError, which the supervisor drops with a warning."""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass
from typing import Any

from dpeer.daemon.decide.failures import FailurePhase, FailureReport, one_line

log = logging.getLogger("dpeer.worker")
MAX_GENERATION = 2**63 - 1  # the largest generation a worker's report may name (the wire's fields are uint64)


@dataclass
class TrainStatus:
    """The newest committed step a worker reported with its parameter digest (the status's `train`)."""

    step: int
    samples: int
    loss: float | None  # None when the step was loaded, not trained, by this worker
    params_digest: str


def generation_of(record: dict[str, Any], warn: bool = True) -> int:
    """The group generation a report names: a count, which the daemon sends on as a uint64
    (GroupFailedRequest.generation; -1 there raised "Value out of range: -1" out of the daemon's
    chores, from a worker that resumed after the end and reported a failure outside any group).
    Anything else is taken as 0 (no group: the leader judges the failure but re-forms nothing), with
    a warning."""
    gen = record.get("gen", 0)
    if type(gen) is int and 0 <= gen <= MAX_GENERATION:
        return gen
    if warn:
        log.warning("a %s report of the worker names generation %.40r, not a count: taken as 0",
                    record.get("kind"), gen)
    return 0


def failure_of(record: dict[str, Any], default: FailurePhase, node_id: str, starts: int) -> FailureReport:
    """A worker's failure record as the report the leader judges (a build's attempt: the worker's
    start count `starts`)."""
    try:
        phase = FailurePhase(record.get("phase", default.value))
    except ValueError:
        phase = default
    step = record.get("step")
    error = one_line(str(record.get("error") or record.get("reason") or "unknown failure"))
    attempt = starts if phase is FailurePhase.BUILD else generation_of(record, warn=False)
    return FailureReport(node_id, phase, step if type(step) is int and step >= 0 else 0, error, attempt)


def speed_of(record: dict[str, Any], current: float | None) -> float | None:
    """The speed a "speed" record reports (micro-batches a second); `current`, with a warning, when
    it is not a finite number above 0 (its member record carries a class of it: decide/speeds.py)."""
    rate = record.get("micro_batches_per_s")
    if type(rate) in (int, float) and 0 < rate <= sys.float_info.max:  # no NaN, inf, nor int past a float
        return float(rate)
    log.warning("a speed report of the worker names %.40r micro-batches a second, not a finite number above 0: "
                "ignored", rate)
    return current


def train_of(record: dict[str, Any], current: TrainStatus | None) -> TrainStatus | None:
    """The status's train fields from a record that carries a digest (the status pairs a step with
    the digest of that very step); `current` for any other record."""
    if not record.get("digest"):
        return current
    loss = float(record["loss"])
    return TrainStatus(int(record["step"]), int(record["samples"]), loss if math.isfinite(loss) else None,
                       str(record["digest"]))
