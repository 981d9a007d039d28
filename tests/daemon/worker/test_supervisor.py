"""The worker supervisor's reading of its worker's reports (no process started)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import subprocess
import sys

import pytest

from dpeer.daemon.config import TrainingConfig
from dpeer.daemon.decide.failures import FailureReport
from tests.support.worker_events import WorkerEventLog
from dpeer.daemon.worker.supervisor import TrainStatus, WorkerSupervisor
from dpeer.daemon.decide.worker_health import judge_worker, missed_view
from dpeer.address import Address
from dpeer.view import View
from dpeer.transport import wire
from dpeer.transport.calls import GroupFailedRequest


def write(data_dir: Path, *records: dict) -> None:
    path = data_dir / "worker" / "reports" / "n1.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def test_reports_drive_readiness_progress_failures_reforms_and_recovery_times(tmp_path: Path) -> None:
    events = WorkerEventLog()
    sup = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig())
    sup.attach(events)
    write(tmp_path, {"kind": "waiting", "t": 1.0}, {"kind": "heal_progress", "t": 1.05, "gen": 1, "done_bytes": 5,
                                                   "total_bytes": 10, "seconds": 1.2, "donors": 2})
    sup.poll(0.0)
    assert sup.status()["heal"] == {"gen": 1, "done_bytes": 5, "total_bytes": 10, "seconds": 1.2, "donors": 2}
    write(tmp_path, {"kind": "formed", "t": 1.1, "gen": 1})
    sup.poll(0.0)
    assert sup.ready and sup.reforms == 1 and sup.train is None and sup.status()["heal"] is None
    write(tmp_path, {"kind": "progress", "t": 2.0, "step": 5, "samples": 320, "loss": 0.5, "digest": "ab"},
          {"kind": "failure", "t": 3.0, "gen": 1, "reason": "Connection reset by peer"},
          {"kind": "failure", "t": 3.1, "gen": 1, "reason": "again"},
          {"kind": "formed", "t": 3.2, "gen": 2},
          {"kind": "progress", "t": 3.25, "step": 6, "samples": 384, "loss": 0.4, "digest": "cd"})
    sup.poll(0.0)
    assert [(g, r.phase.value, r.error) for g, r in events.failures] == [(1, "group", "Connection reset by peer"), (1, "group", "again")]
    assert sup.train is not None and (sup.train.step, sup.train.params_digest) == (6, "cd")
    assert sup.reforms == 2
    assert [round(s, 3) for s in sup.take_recoveries()] == [0.25]
    assert sup.take_recoveries() == []


def test_a_torn_last_line_waits_for_its_end(tmp_path: Path) -> None:
    sup = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig())
    sup.attach(WorkerEventLog())
    path = tmp_path / "worker" / "reports" / "n1.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"kind": "waiting", "t": 1.0}\n{"kind": "prog')
    sup.poll(0.0)
    assert sup.ready and sup.train is None
    with path.open("a") as f:
        f.write('ress", "t": 2, "step": 1, "samples": 64, "loss": 1.0, "digest": "x"}\n')
    sup.poll(0.0)
    assert sup.train is not None and sup.train.step == 1


@pytest.mark.parametrize(
    "now, last, stopped, hung, why",
    [
        (10.0, 9.5, None, False, "last report 0.5s ago"),
        (100.0, 30.0, None, True, "no report for 70.0s"),
        (10.0, 9.9, 4.0, True, "stopped by a signal for 6.0s"),
        (10.0, 9.9, 8.0, False, "stopped for 2.0s"),
        (70.0, 9.0, 69.0, True, "no report for 61.0s"),
    ],
)
def test_judge_worker(now, last, stopped, hung, why) -> None:
    verdict = judge_worker(now, last, stopped, silent_limit=60.0, stopped_limit=5.0)
    assert verdict.hung is hung and why in verdict.reason


def test_the_status_pairs_a_step_with_its_own_digest(tmp_path: Path) -> None:
    sup = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig(digest_every=3))
    sup.attach(WorkerEventLog())
    assert sup.command()[sup.command().index("--digest-every") + 1] == "3"
    assert sup.command()[sup.command().index("--reduction") + 1] == "exact"
    fast = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig(reduction="fast", threads=2))
    assert fast.command()[fast.command().index("--reduction") + 1:][:3] == ["fast", "--threads", "2"]
    write(tmp_path, {"kind": "progress", "t": 1.0, "step": 3, "samples": 192, "loss": 0.9, "digest": "d3"},
          {"kind": "failure", "t": 1.5, "gen": 1, "reason": "reset"},
          {"kind": "progress", "t": 2.0, "step": 4, "samples": 256, "loss": 0.8, "digest": ""},
          {"kind": "progress", "t": 2.1, "step": 5, "samples": 320, "loss": 0.7, "digest": ""})
    sup.poll(0.0)
    assert sup.train == TrainStatus(3, 192, 0.9, "d3") and sup.latest_step == 5
    assert [round(s, 3) for s in sup.take_recoveries()] == [0.5]  # any committed step ends a recovery
    write(tmp_path, {"kind": "progress", "t": 2.2, "step": 6, "samples": 384, "loss": 0.6, "digest": "d6"})
    sup.poll(0.0)
    assert sup.train == TrainStatus(6, 384, 0.6, "d6")


@pytest.mark.parametrize(
    "in_view, ready, given, missed, why",
    [
        (True, True, 0, True, "started after generation 3 was handed out"),
        (True, True, 2, True, "started after generation 3"),
        (True, True, 3, False, "was given generation 3"),
        (True, False, 0, False, "not waiting"),
        (False, True, 0, False, "not waiting"),
    ],
)
def test_missed_view(in_view, ready, given, missed, why) -> None:
    verdict = missed_view(3, in_view, ready, given)
    assert verdict.hung is missed and why in verdict.reason


def test_a_view_counts_as_given_only_once_a_worker_process_was_started(tmp_path: Path) -> None:
    sup = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig())
    sup.attach(WorkerEventLog())
    view = View(2, ("n1",), Address.parse("127.0.0.1:7000"))
    sup.publish(view)
    assert sup.given_generation == 0  # no worker process yet: its start clears the file
    sup.proc = subprocess.Popen([sys.executable, "-c", "pass"])
    sup.proc.wait()
    sup.publish(view)
    assert sup.given_generation == 2


class WireEvents(WorkerEventLog):
    """Builds the request a follower's daemon sends its leader for each failure, as Daemon._send_failure does,
    in its wire form (a uint64 generation)."""

    def worker_failed(self, generation: int, report: FailureReport) -> None:
        wire.to_wire(GroupFailedRequest(node_id=report.node, generation=generation, reason=report.error,
                                        phase=report.phase.value, step=report.step, error=report.error,
                                        attempt=report.attempt))
        super().worker_failed(generation, report)


@pytest.mark.parametrize("gen", [-1, 2**64, "3", 2.0, True, None])
def test_a_report_naming_no_generation_the_wire_takes_is_taken_as_generation_0_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, gen: object) -> None:
    """A worker that resumed after the end reported a failure of generation -1; the daemon sent it on
    as a uint64 and raised 'Value out of range: -1' out of its chores. A worker is semi-trusted."""
    events = WireEvents()
    sup = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig())
    sup.attach(events)
    write(tmp_path, {"kind": "failure", "t": 1.0, "gen": gen, "phase": "train", "step": 7, "error": "ValueError: x"},
          {"kind": "failure", "t": 2.0, "gen": 3, "phase": "group", "step": 8, "error": "reset"})
    sup.poll(0.0)
    assert [(g, r.phase.value, r.step, r.attempt) for g, r in events.failures] == [(0, "train", 7, 0),
                                                                                   (3, "group", 8, 3)]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [f"a failure report of the worker names generation {gen!r}, not a count: taken as 0"], warned


def test_a_report_whose_fields_do_not_parse_is_dropped_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sup = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig())
    sup.attach(WorkerEventLog())
    write(tmp_path, {"kind": "progress", "t": 1.0, "step": "seven", "samples": 1, "loss": 0.1, "digest": "ab"},
          {"kind": "progress", "t": 2.0, "samples": 1, "loss": 0.1, "digest": "ab"},
          {"kind": "progress", "t": 3.0, "step": 2, "samples": 64, "loss": 0.5, "digest": "cd"})
    sup.poll(0.0)
    assert sup.train is not None and (sup.train.step, sup.latest_step) == (2, 2)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2 and all(m.startswith("dropped a malformed report of the worker (") for m in warned), warned
    assert "ValueError: invalid literal for int() with base 10: 'seven'" in warned[0] and "KeyError" in warned[1]


def test_the_status_names_the_job_log(tmp_path: Path) -> None:
    sup = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig())
    assert sup.status()["job_log"] == str(tmp_path / "worker" / "job.log")


def test_a_speed_report_sets_the_workers_speed_and_a_bad_one_is_ignored_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sup = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig())
    sup.attach(WorkerEventLog())
    assert sup.speed is None and sup.status()["micro_batches_per_s"] is None
    write(tmp_path, {"kind": "speed", "micro_batches_per_s": 12.5})
    sup.poll(0.0)
    assert sup.speed == 12.5 and sup.status()["micro_batches_per_s"] == 12.5
    write(tmp_path, *({"kind": "speed", "micro_batches_per_s": bad} for bad in (0, -3.0, "fast", None, True, [1.0])),
          {"kind": "speed"})
    with (tmp_path / "worker" / "reports" / "n1.jsonl").open("a") as f:
        f.write('{"kind": "speed", "micro_batches_per_s": NaN}\n{"kind": "speed", "micro_batches_per_s": Infinity}\n')
    sup.poll(1.0)
    assert sup.speed == 12.5
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 9 and all(m.startswith("a speed report of the worker names") for m in warned), warned
    write(tmp_path, {"kind": "speed", "micro_batches_per_s": 3})
    sup.poll(2.0)
    assert sup.speed == 3.0


def test_a_speed_report_of_an_integer_too_large_for_a_float_is_ignored_not_raised(tmp_path: Path) -> None:
    sup = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig())
    sup.attach(WorkerEventLog())
    write(tmp_path, {"kind": "speed", "micro_batches_per_s": 10**400})
    sup.poll(0.0)
    assert sup.speed is None


def test_a_progress_report_of_a_loss_too_large_for_a_float_is_dropped_not_raised(tmp_path: Path) -> None:
    sup = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig())
    sup.attach(WorkerEventLog())
    write(tmp_path, {"kind": "progress", "step": 3, "samples": 12, "loss": 10**400, "digest": "ab"})
    sup.poll(0.0)
    assert sup.train is None
