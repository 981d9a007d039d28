"""The job's own output on the box's disk: ``DATA_DIR/worker/job.log``, every line the worker (and
its warm spare) writes to stdout or stderr, as written, one line each behind its time, pid and
stream, so the job's author can `tail -F` their script's prints and tracebacks:

    2025-06-01T10:00:00.123Z pid=4242 stdout: epoch 1 loss 0.3127
    2025-06-01T10:00:00.130Z pid=4242 stderr: Traceback (most recent call last):

The daemon writes it (the readers of the worker's pipes, output.py) and marks each worker's
start and exit in it (stream `dpeer`). It stays bounded: once the live file passes ROTATE_BYTES
it is renamed to ``job.log.1`` (replacing the older one) and a new one is started, so a data dir
holds at most 2 x ROTATE_BYTES and a line of it (a line is at most MAX_LINE bytes of output).
A write that fails (a full disk) is warned of once and skipped: the job's output never stops the
worker, whose pipes must keep draining."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger("dpeer.worker")
JOB_LOG = "job.log"  # in DATA_DIR/worker
ROTATE_BYTES = 4 * 1024 * 1024  # the live file past this is renamed to job.log.1 (the one before it dropped)
KEPT_SUFFIX = ".1"


def stamp(when: float) -> str:
    """UTC with milliseconds, as the daemon's text log writes it: 2025-06-01T10:00:00.123Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + f".{int(when * 1000) % 1000:03d}Z"


class JobLog:
    """Appends lines to one job log file, rotating it past `rotate_bytes`; safe across threads
    (each pipe of each worker process has a reader thread of its own)."""

    def __init__(self, path: Path, rotate_bytes: int = ROTATE_BYTES) -> None:
        self.path = path
        self.rotate_bytes = rotate_bytes
        self._lock = threading.Lock()
        self._file: BinaryIO | None = None
        self._bytes = 0
        self._failing = False  # a write failed and was warned of; warned again only after one succeeds

    def line(self, pid: int, stream: str, text: str, when: float | None = None) -> None:
        """Append `text` (one line, without its line break) that process `pid` wrote to `stream`."""
        data = f"{stamp(time.time() if when is None else when)} pid={pid} {stream}: {text}\n".encode(errors="replace")
        with self._lock:
            try:
                if self._file is None:
                    self._open()
                assert self._file is not None
                self._file.write(data)
                self._file.flush()
                self._bytes += len(data)
                if self._bytes > self.rotate_bytes:
                    self._rotate()
                self._failing = False
            except OSError as exc:
                self._close()
                if not self._failing:
                    self._failing = True
                    log.warning("cannot write the job's output to %s (%s); it still reaches the daemon's log",
                                self.path, exc.strerror or exc)

    def close(self) -> None:
        """Close the file (it is opened again by the next line)."""
        with self._lock:
            self._close()

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._file = os.fdopen(fd, "ab", buffering=0)
        self._bytes = os.fstat(fd).st_size

    def _rotate(self) -> None:
        """Seal the live file as job.log.1; the next line starts a new one (`tail -F` follows it)."""
        self._close()
        os.replace(self.path, self.path.with_name(self.path.name + KEPT_SUFFIX))

    def _close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
        self._file, self._bytes = None, 0
