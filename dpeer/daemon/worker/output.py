"""A worker's stdout and stderr in the daemon's log. The worker (and its warm spare) writes to two
pipes that threads of the daemon read, so nothing it writes reaches the daemon's own stdout or
stderr raw. Each stderr line becomes an info record of `dpeer.worker.stderr`, and a Python
traceback, with the exceptions chained to it, one error record that carries it whole (file and
line of every frame) in its `traceback` field; each stdout line (a job's print()) an info record of
`dpeer.job.stdout`. Every record carries the worker's `pid` (the log adds the node's id). So an
exception reaches the log once, in the log's format, and a JSON log stays one object a line. Both
streams also go, line by line as written, to the job's own log file (job_log.py)."""

from __future__ import annotations

import enum
import logging
import os
import select
import subprocess
import threading
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterator

from dpeer.daemon.worker.job_log import JobLog
from dpeer.daemon.logs import TRACEBACK, fields

log = logging.getLogger("dpeer.worker.stderr")
stdout_log = logging.getLogger("dpeer.job.stdout")
HEADS = ("Traceback (most recent call last):", "Exception Group Traceback (most recent call last):")
CHAINS = ("During handling of the above exception, another exception occurred:",
          "The above exception was the direct cause of the following exception:")
QUIET_S = 0.2  # a traceback followed by this much silence is complete (Python writes one in a burst)
MAX_LINE = 65536  # a longer stretch without a line break is logged as a line of its own


@dataclass(frozen=True)
class StderrRecord:
    """One log record of the worker's stderr: a line, or a traceback and its last line."""

    message: str
    traceback: str | None = None


class Phase(enum.Enum):
    """Where the grouper is in the worker's output."""

    LINES = "lines"  # between tracebacks: each line is a record
    FRAMES = "frames"  # inside a traceback's indented frames
    RAISED = "raised"  # after a traceback's exception line: a chained one may follow
    CHAINED = "chained"  # after "During handling ...": the next traceback belongs to this one


@dataclass
class StderrLines:
    """Groups a worker's stderr lines into records (pure: lines in, records out). A traceback is
    held until a line that cannot continue it arrives, or until flush() (silence, or the end)."""

    phase: Phase = Phase.LINES
    block: list[str] = field(default_factory=list)
    blanks: int = 0  # blank lines seen after an exception line, kept if a chained traceback follows
    group: bool = False  # the block is an exception group's (every line of it indented)

    @property
    def holding(self) -> bool:
        """True while a traceback is held for the lines that may continue it."""
        return bool(self.block)

    def feed(self, line: str) -> list[StderrRecord]:
        """The records that `line` (without its line break) completes."""
        line = line.rstrip("\r").rpartition("\r")[2]  # a progress bar's last redraw, as a terminal shows it
        indented = line[:1] in (" ", "\t")
        if self.phase is Phase.FRAMES and (indented or not line.strip()):
            self.block.append(line)
            return []
        if self.phase in (Phase.FRAMES, Phase.RAISED) and line in CHAINS:  # an exception group's ends indented
            self._continue(line, Phase.CHAINED)
            return []
        if self.phase is Phase.FRAMES and not self.group:
            self.block.append(line)  # the exception's own line
            self.phase = Phase.RAISED
            return []
        if self.phase in (Phase.RAISED, Phase.CHAINED) and not line.strip():
            self.blanks += 1
            return []
        if self.phase is Phase.CHAINED and _is_head(line):
            self._continue(line, Phase.FRAMES)
            self.group = indented
            return []
        done = self.flush()
        if _is_head(line):
            self.block, self.phase, self.group = [line], Phase.FRAMES, indented
        elif line.strip():
            done.append(StderrRecord(line))
        return done

    def flush(self) -> list[StderrRecord]:
        """The held traceback as a record (none held: nothing), ready for the next line."""
        block, self.block, self.phase, self.blanks, self.group = self.block, [], Phase.LINES, 0, False
        while block and not block[-1].strip():
            block.pop()
        if not block:
            return []
        return [StderrRecord(_raised(block), "\n".join(block))]

    def _continue(self, line: str, phase: Phase) -> None:
        self.block += [""] * self.blanks + [line]
        self.blanks, self.phase = 0, phase


def _is_head(line: str) -> bool:
    """A traceback's first line (an exception group's is indented and drawn with + and |)."""
    return line.strip(" +|\t") in HEADS


def _raised(block: list[str]) -> str:
    """The line that names the exception: in the last traceback of the block, the exception line
    (an exception group's is drawn after "| " at its heading's indent)."""
    start = max(i for i, line in enumerate(block) if _is_head(line))
    head = block[start]
    margin = head[: len(head) - len(head.lstrip(" \t"))]
    if not margin:
        rest = [line for line in block[start + 1:] if line.strip() and line[:1] not in (" ", "\t")]
        return rest[-1] if rest else block[-1].strip()
    prefix = margin + "| "
    drawn = [line[len(prefix):] for line in block[start + 1:] if line.startswith(prefix)]
    return next((line for line in drawn if line.strip() and line[:1] not in (" ", "\t")), block[-1].strip())


def spawn(command: list[str], env: dict[str, str], job_log: JobLog | None = None, **popen: Any) -> subprocess.Popen:
    """Start a worker process whose stdout and stderr go to the daemon's log (by a thread each)
    and, line by line, to `job_log`; nothing it writes reaches the daemon's own stdout or stderr."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    assert proc.stdout is not None and proc.stderr is not None
    threading.Thread(target=follow_stdout, args=(proc.stdout, proc.pid, job_log), name=f"worker-stdout-{proc.pid}",
                     daemon=True).start()
    threading.Thread(target=follow, args=(proc.stderr, proc.pid, job_log), name=f"worker-stderr-{proc.pid}",
                     daemon=True).start()
    return proc


def follow(stream: IO[bytes], pid: int, job_log: JobLog | None = None) -> None:
    """Log what the process `pid` writes to `stream` (its stderr) until it closes; a held traceback
    is logged after QUIET_S of silence, since a worker that reported a failure may write nothing for long."""
    lines = StderrLines()
    for line in _lines(stream, lambda: QUIET_S if lines.holding else None):
        if line is None:
            _log(lines.flush(), pid)
            continue
        if job_log is not None:
            job_log.line(pid, "stderr", _shown(line))
        _log(lines.feed(line), pid)
    _log(lines.flush(), pid)


def follow_stdout(stream: IO[bytes], pid: int, job_log: JobLog | None = None) -> None:
    """Log each line the process `pid` writes to `stream` (its stdout) until it closes: an info
    record of `dpeer.job.stdout` (blank lines only in the job log)."""
    for line in _lines(stream, lambda: None):
        assert line is not None
        text = _shown(line)
        if job_log is not None:
            job_log.line(pid, "stdout", text)
        if text.strip():
            stdout_log.info("%s", text, extra=fields(pid=pid))


def _shown(line: str) -> str:
    """A line as a terminal shows it: a progress bar's last redraw."""
    return line.rstrip("\r").rpartition("\r")[2]


def _lines(stream: IO[bytes], quiet: Callable[[], float | None]) -> Iterator[str | None]:
    """The lines of `stream` (without their line breaks; a stretch of MAX_LINE bytes without one
    is a line of its own, and so is what follows the last one), and None after `quiet()`
    seconds of silence (None: wait for ever). Ends when the stream closes, which it then does."""
    pending, fd = b"", stream.fileno()
    waiter = select.poll()  # not select(): a daemon holding many sockets has descriptors past FD_SETSIZE
    waiter.register(fd, select.POLLIN)
    with stream:
        while True:
            wait = quiet()
            if wait is not None and not waiter.poll(wait * 1000):
                yield None
                continue
            chunk = os.read(fd, MAX_LINE)
            if not chunk:
                break
            *complete, pending = (pending + chunk).split(b"\n")
            if len(pending) >= MAX_LINE:
                complete, pending = [*complete, pending], b""
            for raw in complete:
                yield raw.decode(errors="replace")
    if pending:
        yield pending.decode(errors="replace")


def _log(records: list[StderrRecord], pid: int) -> None:
    for record in records:
        if record.traceback is None:
            log.info("%s", record.message, extra=fields(pid=pid))
        else:
            log.error("worker pid %d traceback: %s", pid, record.message,
                      extra=fields(pid=pid, **{TRACEBACK: record.traceback}))
