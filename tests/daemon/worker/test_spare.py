"""The warm spare worker, on real processes: a supervisor (no daemon) trains the demo job in a
group of one; a SIGKILLed worker is replaced by the spare, which trains on; stopping ends both."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable

import pytest

from dpeer.daemon.config import TrainingConfig
from tests.support.worker_events import WorkerEventLog
from dpeer.daemon.worker.supervisor import SPARE_AFTER_S, WorkerSupervisor
from dpeer.address import Address
from dpeer.view import View

TIMEOUT = 240.0  # a worker's start is 3-5 CPU-s of imports; the box's two cores are shared
TRAINING = TrainingConfig(steps=100000, global_batch=16, micro_batch=8, checkpoint_every=0)


def poll_until(sup: WorkerSupervisor, what: str, done: Callable[[], bool]) -> None:
    """Drive the supervisor (as the daemon's chores do) until done() or the timeout."""
    deadline = time.monotonic() + TIMEOUT
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {sup.status()}"
        sup.poll(time.monotonic())
        time.sleep(0.05)


def train_alone(sup: WorkerSupervisor, generation: int) -> None:
    """Hand the current worker a one-member view once it is built and ready, and wait for a step."""
    poll_until(sup, "the worker built and waiting", lambda: sup.ready and sup.store_port > 0)
    step = sup.latest_step
    sup.publish(View(generation, ("n1",), Address.parse(f"127.0.0.1:{sup.store_port}")))
    poll_until(sup, f"a step in generation {generation}", lambda: sup.latest_step > step)


@pytest.fixture
def sup(tmp_path: Path):
    sup = WorkerSupervisor("n1", "demo", tmp_path, TRAINING)
    sup.attach(WorkerEventLog())
    yield sup
    sup.stop()


def test_a_killed_worker_is_replaced_by_the_warm_spare_which_trains_on(sup: WorkerSupervisor) -> None:
    sup.start(time.monotonic())
    train_alone(sup, 1)
    poll_until(sup, f"a spare, {SPARE_AFTER_S} s into training", lambda: sup.status()["spare_pid"] is not None)
    first, spare = sup.status()["pid"], sup.status()["spare_pid"]
    os.kill(first, signal.SIGKILL)
    poll_until(sup, "the spare taking over", lambda: sup.status()["pid"] not in (None, first))
    assert sup.status()["pid"] == spare and sup.spare_takeovers == 1
    train_alone(sup, 2)
    poll_until(sup, "a new spare", lambda: sup.status()["spare_pid"] not in (None, spare))
    worker, spare_proc = sup.proc, sup.spare.proc if sup.spare else None
    assert worker is not None and spare_proc is not None
    sup.stop()
    assert worker.poll() is not None and spare_proc.poll() is not None, "stop() ends the worker and the spare"


def test_no_spare_when_turned_off(tmp_path: Path) -> None:
    sup = WorkerSupervisor("n1", "demo", tmp_path, TRAINING.model_copy(update={"spare_worker": False}))
    sup.attach(WorkerEventLog())
    try:
        sup.start(time.monotonic())
        train_alone(sup, 1)
        deadline = time.monotonic() + SPARE_AFTER_S + 1.0
        while time.monotonic() < deadline:  # bounded: the spare would have come by now
            sup.poll(time.monotonic())
            time.sleep(0.05)
        assert sup.spare is None and sup.status()["spare_pid"] is None
    finally:
        sup.stop()
