"""Runs the user's job in a worker process: starts and restarts it, feeds it committed views
through the local channel, and reads what it reports (ready, progress, failures, checkpoints).
A worker that crashed is restarted; one that hangs (silent past `hang_after`, or stopped by a
signal past `stopped_after`) is killed and restarted, and the new one heals from its peers.

The worker is a child of the daemon in the daemon's process group, so killing the box (or the
daemon's group) kills both, and the worker never outlives its daemon for long: it gives up when
no view arrives within its idle limit.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
from pathlib import Path
from typing import Any, Protocol

from dpeer.daemon.decide.checkpoints import Held
from dpeer.daemon.config import TrainingConfig
from dpeer.daemon.decide.failures import FailurePhase, FailureReport, LastFailure, note_failure
from dpeer.daemon.worker.command import worker_command, worker_env
from dpeer.daemon.worker.job_log import JOB_LOG, JobLog
from dpeer.daemon.worker.report_fields import TrainStatus, failure_of, generation_of, speed_of, train_of
from dpeer.daemon.worker.spare import WarmSpare
from dpeer.channel.local import Assignment, ReportTail, publish_checkpoint, publish_view
from dpeer.daemon.decide.worker_health import judge_worker
from dpeer.daemon.worker.output import spawn
from dpeer.statemachine.state import Checkpoint
from dpeer.view import View

log = logging.getLogger("dpeer.worker")
# Seconds before restarting a worker that exited, by how many exits in a row came without a
# committed step between them: the first at once (a warm spare takes over), a crash loop slows down.
RESTART_BACKOFF = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
SPARE_AFTER_S = 2.0  # a spare starts once the worker has trained this long: its imports never slow a build or a forming group


class WorkerEvents(Protocol):
    """What a worker tells its daemon (the worker link, worker/link.py, implements it; attach() wires it)."""

    def worker_failed(self, generation: int, report: FailureReport) -> None:
        """The worker's group, step or build failed (generation 0 for a build)."""

    def checkpoint_written(self, held: Held) -> None:
        """The worker wrote the checkpoint of `held.step`."""

    def worker_spawned(self, pid: int) -> None:
        """A new worker process started (real processes only)."""


class Worker(Protocol):
    """What the daemon drives of its worker: WorkerSupervisor (a real process) or the
    simulation's modelled worker (tests/house/worker.py)."""

    ready: bool
    done: bool
    fenced: bool
    halted: str
    store_port: int
    given_generation: int
    train: TrainStatus | None
    last_failure: LastFailure | None
    latest_step: int
    reforms: int
    speed: float | None  # the worker's latest measured micro-batches a second (None: not reported)

    def attach(self, events: WorkerEvents) -> None:
        """Tell `events` of failures and checkpoints from now on (the worker starts before its daemon)."""

    @property
    def running(self) -> bool:
        """True while a worker process (or model) runs."""

    def status(self) -> dict[str, Any]:
        """The status document's `worker`."""

    def take_recoveries(self) -> list[float]:
        """Recovery times since the last call."""

    def publish(self, view: View, checkpoint: Checkpoint | None = None) -> None:
        """Hand a committed view to the worker."""

    def publish_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Record the newest committed checkpoint for the worker."""

    def poll(self, now: float) -> None:
        """Read its reports; restart it when it died."""

    def fence(self, fenced: bool, why: str, now: float) -> None:
        """Stop (or let start again) training while no quorum is reachable."""

    def halt(self, why: str) -> None:
        """The job was committed as failed."""

    def resume(self, now: float) -> None:
        """The job runs again."""

    def restart(self, now: float, why: str) -> None:
        """Replace the worker now."""

    def stop(self) -> None:
        """Stop the worker (daemon shutdown)."""


class WorkerSupervisor:
    """Keeps one worker process running the job; see the module docstring."""

    def __init__(
        self, node_id: str, job: str, data_dir: Path, training: TrainingConfig,
        store_bind: tuple[str, int] = ("127.0.0.1", 0),
    ) -> None:
        self.node_id, self.job, self.training = node_id, job, training
        self.dir = data_dir / "worker"
        self.ckpt_dir = data_dir / "checkpoints"
        self.store_bind = store_bind
        self.store_port = 0  # the port the current worker bound for the rendezvous store (0: not yet)
        self.starts = 0
        self.halted = ""  # why the job was halted (the worker is stopped and not restarted), or ""
        self.events: WorkerEvents | None = None  # the daemon, once it attached
        self.proc: subprocess.Popen | None = None
        self.ready, self.done, self.restarts = False, False, 0
        self.train: TrainStatus | None = None
        self.latest_step = 0
        self.failures = 0
        self.last_failure: LastFailure | None = None  # the job's newest build or step failure here, until it passes
        self.reforms = 0
        self.recoveries: list[float] = []
        self._failed_at: float | None = None
        self._tail = ReportTail(str(self.dir), node_id)
        self._restart_at: float | None = None
        self.fenced = False
        self.hangs = 0
        self.last_formed: dict[str, Any] | None = None
        self._last_report: float | None = None
        self._stopped_since: float | None = None
        self.given_generation = 0
        self.job_log = JobLog(self.dir / JOB_LOG)  # the job's own stdout and stderr, line by line
        self.spare = WarmSpare(self.job_log) if training.spare_worker else None
        self.spare_takeovers = 0
        self.heal: dict[str, Any] | None = None  # the newest progress of a heal under way (long ones only)
        self.paused_at: int | None = None  # the step the worker holds at while training is paused
        self.speed: float | None = None  # the latest measured micro-batches a second (kept across restarts: same box)
        self._crashes = 0  # worker exits in a row without a committed step between them
        self._trained_at: float | None = None  # when the current worker first reported a committed step

    def status(self) -> dict[str, Any]:
        """The worker's process state for the status document."""
        return {"pid": self.proc.pid if self.proc else None, "ready": self.ready, "done": self.done,
                "restarts": self.restarts, "hangs": self.hangs, "failures_reported": self.failures,
                "groups_formed": self.reforms, "store_port": self.store_port, "halted": self.halted or None,
                "fenced": self.fenced, "last_formed": self.last_formed,
                "spare_pid": self.spare.proc.pid if self.spare is not None and self.spare.proc is not None else None,
                "spare_takeovers": self.spare_takeovers, "heal": self.heal, "paused_at": self.paused_at,
                "job_log": str(self.job_log.path), "micro_batches_per_s": self.speed}

    @property
    def running(self) -> bool:
        """True while a worker process runs (or is being watched)."""
        return self.proc is not None

    def take_recoveries(self) -> list[float]:
        """Seconds from each reported group failure to the next committed step, since the last call."""
        out, self.recoveries = self.recoveries, []
        return out

    def command(self) -> list[str]:
        """The worker's command line (worker/command.py)."""
        return worker_command(self.node_id, self.job, self.training, self.dir, self.ckpt_dir, self.store_bind)

    def attach(self, events: WorkerEvents) -> None:
        """Tell `events` (the worker link) of failures, checkpoints and new processes from now on."""
        self.events = events

    def start(self, now: float) -> None:
        """Start the worker; stale view files of an earlier run (and temp files of a write a kill
        interrupted) are cleared first (channel state).
        The reports an earlier daemon run left are skipped; the last ones of this run's previous
        worker (written after the last poll, before it died) are read first."""
        views = self.dir / "views"
        views.mkdir(parents=True, exist_ok=True)
        for stale in views.glob("view-*"):
            stale.unlink()
        if self.starts == 0:
            self._tail.skip_existing()
        else:
            for record in self._tail.read_new():
                self._on_report(record)
        command = self.command()
        spare = self.spare.take(command) if self.spare is not None else None
        # its stdout and stderr (tracebacks whole) go to the daemon's log and to the job log
        self.proc = spare or spawn(command, worker_env(), self.job_log)
        self.spare_takeovers += spare is not None
        self._trained_at = None
        self.ready = False
        self._restart_at = None
        self._last_report = self._stopped_since = None
        self.latest_step = 0
        self.given_generation = 0
        self.paused_at = None
        self.store_port = 0
        self.starts += 1
        log.info("started worker pid %d for job %s%s", self.proc.pid, self.job, " (the warm spare)" if spare else "")
        self.job_log.line(self.proc.pid, "dpeer", f"worker started for job {self.job}{' (the warm spare)' if spare else ''}")
        if self.events is not None:
            self.events.worker_spawned(self.proc.pid)

    def publish(self, view: View, checkpoint: Checkpoint | None = None) -> None:
        """Hand a committed view to the worker, with the newest committed checkpoint to resume from."""
        step, digest = (checkpoint.step, checkpoint.digest) if checkpoint is not None else (0, "")
        publish_view(str(self.dir), Assignment(view, step, digest, self.store_bind[0]))
        if view.members:
            self.paused_at = None  # training resumed, with or without this box
        if self.proc is not None:
            self.given_generation = view.generation

    def publish_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Record the newest committed checkpoint for the worker, which resumes from it at start
        (before it reports ready, so its peers never wait on the load)."""
        publish_checkpoint(str(self.dir), checkpoint.step, checkpoint.digest)

    def poll(self, now: float) -> None:
        """Read new reports; restart a worker that died, with backoff; note a finished job."""
        records = self._tail.read_new()
        for record in records:
            self._on_report(record)
            if record.get("kind") == "progress" and self._trained_at is None:
                self._trained_at = now
        if records:
            self._last_report = now
        if self.proc is not None and self.proc.poll() is not None:
            self._on_exit(now, self.proc.returncode)
        elif self.proc is not None:
            self._watch(now)
        if self.proc is None and self._restart_at is not None and now >= self._restart_at and not self.fenced \
                and not self.halted:
            self.restarts += 1
            self.start(now)
        elif self.spare is not None and self.proc is not None and self._trained_at is not None \
                and now - self._trained_at >= SPARE_AFTER_S and not self.done and not self.halted:
            self.spare.ensure(self.command(), worker_env())

    def _watch(self, now: float) -> None:
        """Kill a worker that hangs (it then restarts like a crashed one); silence counts only
        after its first report, so a slow job build is never taken for a hang."""
        assert self.proc is not None
        stopped = _stopped(self.proc.pid)
        if not stopped:
            self._stopped_since = None
        elif self._stopped_since is None:
            self._stopped_since = now
        last = self._last_report if self._last_report is not None else math.inf
        verdict = judge_worker(now, last, self._stopped_since, self.training.hang_after, self.training.stopped_after)
        if not verdict.hung:
            return
        self.hangs += 1
        log.warning("worker pid %d hangs (%s): killing it; a new worker will heal from its peers",
                    self.proc.pid, verdict.reason)
        self.proc.kill()
        self.proc.wait(timeout=30)
        self._on_exit(now, self.proc.returncode)

    def fence(self, fenced: bool, why: str, now: float) -> None:
        """Stop training while this node cannot reach a quorum (the minority side of a partition
        must not train on), and start a worker again once it can; it then heals from its peers."""
        if fenced == self.fenced:
            return
        self.fenced = fenced
        if fenced:
            log.warning("stopping the worker: %s", why)
            self._stop_worker()
            self.proc, self.ready = None, False
            self._restart_at = None
        elif not self.done:
            log.info("starting the worker again: %s", why)
            self._restart_at = now

    def _on_report(self, record: dict[str, Any]) -> None:
        """Take one report of the worker. A worker is semi-trusted input (it runs the user's code):
        a report whose fields do not parse is dropped with a warning, never raised into the daemon."""
        try:
            self._take_report(record)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # OverflowError: float(10**400)
            log.warning("dropped a malformed report of the worker (%s: %s): %.300s", type(exc).__name__, exc,
                        record)

    def _take_report(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "built":
            port = record.get("store_port")
            self.store_port = port if type(port) is int and 0 <= port < 65536 else 0
        elif kind == "waiting" and not self.ready:
            self.ready = True
            log.info("worker is ready (job built, waiting for a view)")
            if self.last_failure is not None and self.last_failure.report.phase is FailurePhase.BUILD:
                self.last_failure = None
        elif kind == "progress":
            self._crashes = 0
            self.latest_step = max(self.latest_step, int(record["step"]))
            if self.last_failure is not None and self.latest_step > self.last_failure.report.step:
                self.last_failure = None
            self.train = train_of(record, self.train)
            if self._failed_at is not None:
                self.recoveries.append(max(0.0, float(record["t"]) - self._failed_at))
                self._failed_at = None
        elif kind == "digest":  # a step's digest, hashed beside the next step (trainer/digests.py)
            self.train = train_of(record, self.train)
        elif kind == "speed":
            self.speed = speed_of(record, self.speed)
        elif kind == "heal_progress":
            self.heal = {k: record.get(k) for k in ("gen", "done_bytes", "total_bytes", "seconds", "donors")}
        elif kind == "formed":
            self.heal, self.paused_at = None, None
            self.reforms += 1
            self.last_formed = {k: record.get(k) for k in ("gen", "world", "rank", "step", "healed", "heal_bytes",
                                                           "seconds", "heal_s", "t")}
        elif kind == "failure":
            self.failures += 1
            if self._failed_at is None:
                self._failed_at = float(record["t"])
            report = failure_of(record, FailurePhase.GROUP, self.node_id, self.starts)
            self.last_failure = note_failure(self.last_failure, report)  # the status shows a step's, with its repeats
            self._tell().worker_failed(generation_of(record), report)
        elif kind == "job_error":
            report = failure_of(record, FailurePhase.BUILD, self.node_id, self.starts)
            self.last_failure = note_failure(self.last_failure, report)
            repeats = self.last_failure.repeats if self.last_failure is not None else 1
            log.error("the job could not be built on this box (%d time%s in a row): %s", repeats,
                      "" if repeats == 1 else "s", report.error)
            self._tell().worker_failed(0, report)
        elif kind == "paused":
            self.paused_at = int(record.get("step", 0))
            self.train = train_of(record, self.train)
            log.info("worker stopped at step %s (generation %s): training is paused; it holds its state until resumed",
                     record.get("step"), record.get("gen"))
        elif kind == "checkpoint":
            log.info("worker wrote the checkpoint of step %s (sha256 %s)", record.get("step"), record.get("digest"))
            step, digest = record.get("step"), record.get("params_digest")
            if type(step) is int and step > 0 and isinstance(digest, str):
                self._tell().checkpoint_written(Held(step, digest, record.get("final") is True))

    def _tell(self) -> WorkerEvents:
        """The worker link: reports are read in poll(), which only the attached link's chores call."""
        assert self.events is not None, "a worker's reports were read before a daemon attached"
        return self.events

    def halt(self, why: str) -> None:
        """The job was committed as failed: stop the worker and start none until resume()."""
        if self.halted:
            return
        self.halted = why
        log.error("the job is halted: %s", why)
        self.stop()
        self.proc, self.ready, self._restart_at = None, False, None

    def resume(self, now: float) -> None:
        """The job is running again (an operator's retry): start a fresh worker."""
        if not self.halted:
            return
        self.halted = ""
        self.last_failure, self._crashes = None, 0  # a fresh start: the restart backoff begins anew
        log.info("the job runs again: starting the worker")
        if not self.done:
            self._restart_at = now

    def restart(self, now: float, why: str) -> None:
        """Replace the worker now (it must start afresh, e.g. to load a checkpoint fetched for it)."""
        log.info("restarting the worker: %s", why)
        self._stop_worker()
        self.proc, self.ready, self.done = None, False, False
        self._restart_at = now

    def _on_exit(self, now: float, code: int) -> None:
        if self.proc is not None:
            self.job_log.line(self.proc.pid, "dpeer", f"worker exited with code {code}")
        self.proc, self.ready = None, False
        if code == 0:
            self.done = True
            log.info("worker finished the job")
            if self.spare is not None:
                self.spare.discard()
            return
        if self.halted:
            return
        delay = RESTART_BACKOFF[min(self._crashes, len(RESTART_BACKOFF) - 1)]
        self._crashes += 1
        log.warning("worker exited with code %d; restarting in %.1fs", code, delay)
        self._restart_at = now + delay

    def stop(self) -> None:
        """Terminate the worker and any spare (daemon shutdown, a halted job)."""
        if self.spare is not None:
            self.spare.discard()
        self._stop_worker()

    def _stop_worker(self) -> None:
        """Terminate the worker process; a spare stays ready to replace it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.job_log.line(self.proc.pid, "dpeer", f"worker stopped by the daemon (exit code {self.proc.returncode})")


def _stopped(pid: int) -> bool:
    """True when the kernel reports the process stopped (state T or t in /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] in (b"T", b"t")
