"""A warm spare worker: a process started ahead of need with the worker's command plus ``--spare``.
It imports torch and what the optimizer's first step pulls in (torch._dynamo), about 3 CPU-s on a
small box, then waits on its stdin. Taking it over is one line written to that pipe, so a crashed
worker is replaced by a process that only has to build the job, not by a fresh interpreter.

The supervisor starts a spare only while its worker trains (never beside a build it would slow
down) and discards it when the job ends, halts or the daemon stops. It costs one idle process
holding torch (about 200 MB of memory); `training.spare_worker: false` turns it off.
"""

from __future__ import annotations

import logging
import subprocess

from dpeer.channel.local import SPARE_GO
from dpeer.daemon.worker.job_log import JobLog
from dpeer.daemon.worker.output import spawn

log = logging.getLogger("dpeer.worker")


class WarmSpare:
    """At most one spare process for one worker command."""

    def __init__(self, job_log: JobLog | None = None) -> None:
        self.job_log = job_log  # where its output goes, as the worker's (its stdout and stderr are piped; stdin is the go signal)
        self.proc: subprocess.Popen | None = None
        self._command: list[str] = []

    def ready_for(self, command: list[str]) -> bool:
        """True when a live spare was started for exactly this command."""
        return self.proc is not None and self.proc.poll() is None and self._command == command

    def ensure(self, command: list[str], env: dict[str, str]) -> None:
        """Start a spare for ``command`` unless a live one for it exists (a dead or stale one is
        discarded first)."""
        if self.ready_for(command):
            return
        self.discard()
        self.proc = spawn([*command, "--spare"], env, self.job_log, stdin=subprocess.PIPE)
        self._command = list(command)
        log.info("started a warm spare worker, pid %d", self.proc.pid)

    def take(self, command: list[str]) -> subprocess.Popen | None:
        """The spare, told to go on as the worker, or None when there is no live spare for this
        command (the caller then starts a fresh process)."""
        if not self.ready_for(command):
            self.discard()
            return None
        proc, self.proc = self.proc, None
        assert proc is not None and proc.stdin is not None
        try:
            proc.stdin.write(SPARE_GO)
            proc.stdin.close()
        except OSError:  # it died between the check and the write
            _reap(proc)
            return None
        return proc

    def discard(self) -> None:
        """End the spare, if any: closing its stdin tells it to exit; kill it if it does not."""
        proc, self.proc = self.proc, None
        if proc is not None:
            _reap(proc)


def _reap(proc: subprocess.Popen) -> None:
    """Close the spare's pipe and wait for it to go (killed after a short grace)."""
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
