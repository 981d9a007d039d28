"""The reports channel stays bounded: the worker seals its reports file past a size and the daemon
deletes what it has read, without the daemon ever missing or repeating a record (across a
rotation, a rotation in the middle of a read, a daemon restart, a worker killed mid-write)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from dpeer.address import Address
from dpeer.channel import local
from dpeer.channel.local import (Assignment, DirViewSource, ReportTail, publish_view, read_reports, report_segments)
from dpeer.daemon.config import TrainingConfig
from dpeer.daemon.worker import supervisor as supervisor_mod
from dpeer.daemon.worker.supervisor import WorkerSupervisor
from dpeer.view import View
from tests.support.clocks import ManualClock
from tests.support.worker_events import WorkerEventLog

ROTATE = 2000  # bytes: a segment every ~20 progress records


@pytest.fixture(autouse=True)
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "REPORTS_ROTATE_BYTES", ROTATE)


def steps_read(records: list[dict]) -> list[int]:
    return [r["step"] for r in records if r["kind"] == "progress"]


def report(src: DirViewSource, steps: range) -> None:
    for s in steps:
        src.report_progress(s, 64 * s, 0.5, "")


def test_every_record_is_read_once_in_order_across_rotations_and_the_folder_stays_small(tmp_path: Path) -> None:
    src = DirViewSource(str(tmp_path), "n1", ManualClock())
    tail = ReportTail(str(tmp_path), "n1")
    rng = random.Random(4)
    got: list[int] = []
    step = 0
    while step < 2000:
        n = rng.choice([1, 3, 17, 40, 90])
        report(src, range(step, step + n))
        step += n
        got += steps_read(tail.read_new())
        segments = report_segments(str(tmp_path / "reports"), "n1")
        assert len(segments) <= local.REPORTS_KEPT, segments  # read ones beyond the kept are gone
        assert sum(os.path.getsize(p) for _, p in segments) <= local.REPORTS_KEPT * (ROTATE + 200)
    assert got == list(range(step))
    assert os.path.getsize(tmp_path / "reports" / "n1.jsonl") <= ROTATE + 200
    kept = steps_read(read_reports(str(tmp_path), "n1"))  # the history still there: the newest records, in order
    assert kept == list(range(step - len(kept), step)) and len(kept) >= 15


def test_a_rotation_between_opening_the_live_file_and_listing_the_segments_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = DirViewSource(str(tmp_path), "n1", ManualClock())
    tail = ReportTail(str(tmp_path), "n1")
    report(src, range(5))
    assert steps_read(tail.read_new()) == list(range(5))
    report(src, range(5, 10))
    listing = local.report_segments

    def rotating_first(folder: str, node: str) -> list[tuple[int, str]]:
        monkeypatch.setattr(local, "report_segments", listing)
        report(src, range(10, 40))  # the worker writes on and seals the file the tail holds open
        return listing(folder, node)

    monkeypatch.setattr(local, "report_segments", rotating_first)
    first = steps_read(tail.read_new())
    assert first == list(range(5, first[-1] + 1)) and first[-1] >= 20
    report(src, range(40, 45))
    assert first + steps_read(tail.read_new()) == list(range(5, 45))


def test_a_restarted_daemon_skips_the_earlier_run_and_reads_all_of_the_new_one(tmp_path: Path) -> None:
    src = DirViewSource(str(tmp_path), "n1", ManualClock())
    report(src, range(100))  # an earlier run's reports, read by nobody
    tail = ReportTail(str(tmp_path), "n1")
    tail.skip_existing()
    assert len(report_segments(str(tmp_path / "reports"), "n1")) <= local.REPORTS_KEPT
    report(src, range(100, 160))
    assert steps_read(tail.read_new()) == list(range(100, 160))


def test_a_worker_killed_mid_write_loses_only_its_torn_record(tmp_path: Path) -> None:
    tail = ReportTail(str(tmp_path), "n1")
    report(DirViewSource(str(tmp_path), "n1", ManualClock()), range(3))
    with open(tmp_path / "reports" / "n1.jsonl", "a") as f:
        f.write('{"kind": "progress", "step": 3, "sam')  # killed mid-write
    assert steps_read(tail.read_new()) == [0, 1, 2]
    report(DirViewSource(str(tmp_path), "n1", ManualClock()), range(4, 50))  # the next worker
    assert steps_read(tail.read_new()) == list(range(4, 50))


def test_the_supervisor_reads_a_dead_workers_last_reports_before_starting_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reports written after the last poll, before the worker died (its failure, a checkpoint),
    reach the daemon; only an earlier daemon run's are skipped."""
    spawned: list[subprocess.Popen] = []

    def spawn(command: list[str], env: dict[str, str], job_log: object = None) -> subprocess.Popen:
        spawned.append(subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"]))
        return spawned[-1]

    monkeypatch.setattr(supervisor_mod, "spawn", spawn)
    events = WorkerEventLog()
    sup = WorkerSupervisor("n1", "demo", tmp_path, TrainingConfig(spare_worker=False))
    sup.attach(events)
    worker = tmp_path / "worker"
    old = DirViewSource(str(worker), "n1", ManualClock())
    old.report_failure("an earlier run's", 1)
    sup.start(0.0)
    first = DirViewSource(str(worker), "n1", ManualClock())
    report(first, range(30))
    sup.poll(1.0)
    spawned[-1].wait(timeout=30)
    read = sup._tail.read_new

    def then_last_words() -> list[dict]:  # they land just after the poll read the file
        out = read()
        first.report_failure("peer gone", 2, step=30)
        first.report_event("checkpoint", step=30, digest="f" * 64, params_digest="p" * 64, rank=0, final=False)
        monkeypatch.setattr(sup._tail, "read_new", read)
        return out

    monkeypatch.setattr(sup._tail, "read_new", then_last_words)
    sup.poll(2.0)  # sees the exit and restarts at once
    assert sup.starts == 2 and sup.latest_step == 0
    assert [r.error for _, r in events.failures] == ["peer gone"]
    assert [h.step for h in events.checkpoints] == [30]
    for p in spawned:
        p.wait(timeout=30)


def test_only_the_newest_views_are_kept_and_a_worker_reads_the_newest(tmp_path: Path) -> None:
    d = str(tmp_path)
    for g in range(1, 12):
        publish_view(d, Assignment(View(g, ("a",), Address("127.0.0.1", 1000 + g))))
    names = sorted(os.listdir(tmp_path / "views"))
    assert names == [f"view-{g:012d}.json" for g in range(12 - local.VIEWS_KEPT, 12)]
    got = DirViewSource(d, "a", ManualClock()).wait_view(3, 0.0)
    assert got is not None and got.view.generation == 11
