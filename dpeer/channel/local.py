"""The local channel between a daemon and its worker: a directory on the node's own disk.

The daemon (the view authority) writes each committed view atomically as
``views/view-<generation>.json`` (keeping the newest VIEWS_KEPT) and the newest committed
checkpoint as ``checkpoint.json``; the worker appends its reports (waiting, progress, failure)
to ``reports/<node>.jsonl``. Files survive either side restarting, need no port, and a torn
last line is simply skipped. After any report but a step's progress the worker also rings a
doorbell (a datagram to the daemon's Unix socket ``doorbell`` in the directory, which only the
data dir's owner can reach), so the daemon reads the reports at once instead of polling them
often. This module is peer's local API; the trainer imports it.

Reports stay bounded: once the live file passes REPORTS_ROTATE_BYTES the worker renames it to
``reports/<node>.jsonl.<seq>`` (sealed: never written again) and starts a new one; the daemon's
ReportTail reads sealed segments to their end, then the live file, following each file by its
inode, and deletes what it has read but the newest REPORTS_KEPT segments (history for
read_reports). A data dir's reports hold at most (REPORTS_KEPT + 1) segments and a record while
its daemon reads them.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO, Iterator, Protocol, TextIO

from dpeer.address import Address
from dpeer.view import MAX_SHARE, View, valid_shares

POLL_INTERVAL_S = 0.005
# A training worker peeks for a newer view every step; the folder is scanned only when its mtime
# moved or PEEK_RESCAN_S passed (mtimes can be coarser than the gap between two renames).
PEEK_RESCAN_S = 0.05
VIEWS_KEPT = 4  # view files kept: a worker reads only the newest
REPORTS_ROTATE_BYTES = 512 * 1024  # a live reports file past this is sealed (about 4000 steps' progress)
REPORTS_KEPT = 1  # sealed segments the daemon keeps once read, as history (read_reports)
CHECKPOINT_FILE = "checkpoint.json"
# A warm spare worker (daemon/worker/spare.py) waits for this line on its stdin; end of file means: exit unused
SPARE_GO = b"go\n"


class SyncClock(Protocol):
    """The worker's clock (it runs no event loop): dpeer.clock.Clock's now and wall, and a blocking
    sleep on that same clock. A test passes one it moves (tests/support/clocks.py)."""

    def now(self) -> float:
        """Monotonic seconds."""

    def wall(self) -> float:
        """Wall-clock seconds (report timestamps)."""

    def sleep(self, seconds: float) -> None:
        """Block this long."""


class SystemClock:
    """The OS's clock."""

    def now(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def wall(self) -> float:
        """time.time()."""
        return time.time()

    def sleep(self, seconds: float) -> None:
        """time.sleep()."""
        time.sleep(seconds)


SYSTEM = SystemClock()


@dataclass(frozen=True)
class Assignment:
    """What a worker is handed for a generation: the committed view, the newest committed
    checkpoint (step 0 for none) a restarted worker resumes from, and the address this node's
    data plane binds ("" for the store host's own rule)."""

    view: View
    checkpoint_step: int = 0
    checkpoint_digest: str = ""
    bind_host: str = ""

    def to_json(self) -> str:
        """The view file's text (the store address as host and port, the format workers read)."""
        v = self.view
        return json.dumps({"generation": v.generation, "members": list(v.members), "store_host": v.store.host,
                           "store_port": v.store.port, "secret": v.secret, "sites": list(v.sites),
                           "shares": list(v.shares),
                           "checkpoint_step": self.checkpoint_step,
                           "checkpoint_digest": self.checkpoint_digest, "bind_host": self.bind_host}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Assignment":
        d = json.loads(text)
        members, shares = tuple(str(m) for m in d["members"]), d.get("shares", [])
        if type(shares) is not list or not valid_shares(tuple(shares), len(members)):
            raise ValueError(f"a view file's shares must be one weight from 1 to {MAX_SHARE} a member, or none: "
                             f"{shares!r:.100}")
        view = View(int(d["generation"]), members, Address(str(d["store_host"]), int(d["store_port"])),
                    str(d.get("secret", "")), tuple(str(s) for s in d.get("sites", ())), tuple(shares))
        return cls(view, int(d.get("checkpoint_step", 0)), str(d.get("checkpoint_digest", "")),
                   str(d.get("bind_host", "")))


def _atomic_write(path: str, text: str, durable: bool = True) -> None:
    """Replace path with text in one rename; durable also syncs the text before the rename. Only this
    user may read it: a view carries its generation's secret."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def publish_view(directory: str, assignment: Assignment) -> None:
    """Atomically publish a generation's assignment into a ``DirViewSource`` directory (the daemon,
    or a test as the view authority)."""
    views = os.path.join(directory, "views")
    os.makedirs(views, exist_ok=True)
    _atomic_write(os.path.join(views, f"view-{assignment.view.generation:012d}.json"), assignment.to_json())
    for old in sorted(n for n in os.listdir(views) if _view_generation(n) is not None)[:-VIEWS_KEPT]:
        try:
            os.remove(os.path.join(views, old))
        except FileNotFoundError:
            pass


def _view_generation(name: str) -> int | None:
    """The generation of a view file's name, None for any other name (a temp file)."""
    core = name[5:-5] if name.startswith("view-") and name.endswith(".json") else ""
    return int(core) if core.isdigit() else None


def publish_checkpoint(directory: str, step: int, digest: str) -> None:
    """Atomically record the newest committed checkpoint where a starting worker reads it.

    Not synced: the log holds the committed checkpoint durably and the daemon publishes it
    again at every start, so a power loss can only leave a stale or empty hint, which the
    worker reads as "none" until then (see read_committed_checkpoint)."""
    os.makedirs(directory, exist_ok=True)
    text = json.dumps({"step": step, "digest": digest})
    _atomic_write(os.path.join(directory, CHECKPOINT_FILE), text, durable=False)


def read_committed_checkpoint(directory: str) -> tuple[int, str]:
    """(step, digest) of the newest committed checkpoint the daemon recorded; (0, "") for none or
    for an unreadable file (the first view carries the same facts)."""
    try:
        with open(os.path.join(directory, CHECKPOINT_FILE)) as f:
            d = json.load(f)
        step, digest = d["step"], d["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0, ""
    return (step, digest) if type(step) is int and step >= 0 and isinstance(digest, str) else (0, "")


def read_jsonl(path: str) -> list[dict]:
    """Every complete JSON record of a JSON-lines file (a torn line, from a kill mid-write, is
    skipped); none for a file that does not exist (or was removed while this read)."""
    try:
        with open(path, "rb") as f:
            return _records(f.read())
    except FileNotFoundError:
        return []


def _records(data: bytes) -> list[dict]:
    """The JSON objects of JSON-lines bytes; lines that are not one (torn, garbled) are skipped."""
    out = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def report_segments(reports: str, node_id: str) -> list[tuple[int, str]]:
    """(seq, path) of a node's sealed reports files in the ``reports`` folder, oldest first."""
    prefix = f"{node_id}.jsonl."
    try:
        names = os.listdir(reports)
    except FileNotFoundError:
        return []
    return sorted((int(n[len(prefix):]), os.path.join(reports, n)) for n in names
                  if n.startswith(prefix) and n[len(prefix):].isdigit())


def read_reports(directory: str, node_id: str) -> list[dict]:
    """The reports a node appended that are still kept, in order: under a daemon, at least the last
    REPORTS_ROTATE_BYTES of them (a benchmark reading progress times reads here)."""
    reports = os.path.join(directory, "reports")
    out: list[dict] = []
    for _, path in report_segments(reports, node_id):
        out += read_jsonl(path)  # one deleted meanwhile reads as empty
    return out + read_jsonl(os.path.join(reports, f"{node_id}.jsonl"))


DOORBELL = "doorbell"  # the daemon's socket inside the channel directory
SUN_PATH_MAX = 108  # bytes of a Unix socket's path, its final NUL included (Linux)


@contextmanager
def _socket_path(path: str) -> Iterator[str]:
    """path as a Unix socket address: itself when it fits, else the same file reached through
    /proc/self/fd of its directory (a data dir may be deeper than 107 bytes)."""
    if len(os.fsencode(path)) < SUN_PATH_MAX:
        yield path
        return
    fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{os.path.basename(path)}"
    finally:
        os.close(fd)


def doorbell_path(directory: str) -> str:
    """The daemon's doorbell: a Unix socket file in the channel directory, so only those who may
    enter the data dir (0700: its owner) can ring it."""
    return os.path.join(directory, DOORBELL)


class Doorbell:
    """The daemon's end of the doorbell: a non-blocking datagram socket (mode 0600) to watch for
    reads. OSError when another live daemon listens on this directory's; a dead one's socket
    file is replaced."""

    def __init__(self, directory: str) -> None:
        self.path = doorbell_path(directory)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        try:
            with _socket_path(self.path) as address:
                self._bind(address)
            os.chmod(self.path, 0o600)
        except OSError:
            self._sock.close()
            raise

    def _bind(self, address: str) -> None:
        try:
            self._sock.bind(address)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or _listened(address):
                raise
            os.unlink(self.path)  # left by a daemon that was killed
            self._sock.bind(address)

    def fileno(self) -> int:
        """The descriptor an event loop watches."""
        return self._sock.fileno()

    def drain(self) -> int:
        """Take every pending ring; returns how many there were."""
        rings = 0
        while True:
            try:
                self._sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return rings
            rings += 1

    def close(self) -> None:
        """Stop listening and remove the socket file."""
        if self._sock.fileno() < 0:
            return
        self._sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _listened(address: str) -> bool:
    """Whether a live socket is bound at address (a dead one's file refuses the connection)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(address)
        except ConnectionRefusedError:
            return False
    return True


class DirViewSource:
    """``ViewSource`` over a directory: ``views/view-<gen>.json`` in, ``reports/<node>.jsonl`` out."""

    def __init__(self, directory: str, node_id: str, clock: SyncClock = SYSTEM) -> None:
        self.directory, self.clock = directory, clock
        self.node_id = node_id
        self._views = os.path.join(directory, "views")
        reports = os.path.join(directory, "reports")
        os.makedirs(reports, exist_ok=True)
        os.makedirs(self._views, exist_ok=True)
        self._report_path = os.path.join(reports, f"{node_id}.jsonl")
        self._bell = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._bell.setblocking(False)
        self._bell_path = doorbell_path(directory)
        self._reports: TextIO | None = None  # kept open: a training worker reports every step
        self._report_bytes = 0  # the live file's size
        self._scanned: tuple[int, float] = (-1, -1.0)  # (views folder mtime_ns, monotonic time)

    def _newest_generation(self) -> int:
        newest = -1
        with os.scandir(self._views) as it:
            for entry in it:
                generation = _view_generation(entry.name)
                if generation is not None:
                    newest = max(newest, generation)
        return newest

    def _unchanged(self) -> bool:
        """True when the views folder cannot hold a new view since the last scan (peeks only)."""
        mtime, now = os.stat(self._views).st_mtime_ns, self.clock.now()
        if mtime == self._scanned[0] and now - self._scanned[1] < PEEK_RESCAN_S:
            return True
        self._scanned = (mtime, now)
        return False

    def wait_view(self, after_generation: int, timeout: float) -> Assignment | None:
        if timeout > 0:
            self._append({"kind": "waiting", "after": after_generation})
        elif self._unchanged():
            return None
        deadline = self.clock.now() + max(0.0, timeout)
        while True:
            newest = self._newest_generation()
            if newest > after_generation:
                try:
                    with open(os.path.join(self._views, f"view-{newest:012d}.json")) as f:
                        return Assignment.from_json(f.read())
                except FileNotFoundError:
                    continue  # pruned as newer views came in since the scan: scan again
            if self.clock.now() >= deadline:
                return None
            self.clock.sleep(POLL_INTERVAL_S)

    def _append(self, record: dict, ring: bool = True) -> None:
        record["t"] = self.clock.wall()
        if self._reports is None:
            self._reports = self._open_reports()
        line = json.dumps(record) + "\n"
        self._reports.write(line)
        self._report_bytes += len(line)  # ASCII: json.dumps escapes the rest
        if self._report_bytes > REPORTS_ROTATE_BYTES:
            self._seal()
        if ring:
            self._ring()

    def _open_reports(self) -> TextIO:
        """The live reports file, for appending; a torn last line (a worker killed mid-write) is ended
        first, so the next record is not glued to it."""
        f = open(self._report_path, "a", buffering=1)  # noqa: SIM115 (lives with the source)
        self._report_bytes = f.tell()
        if self._report_bytes:
            with open(self._report_path, "rb") as tail:
                tail.seek(-1, os.SEEK_END)
                if tail.read(1) != b"\n":
                    f.write("\n")
        return f

    def _seal(self) -> None:
        """Rename the live reports file to the next sealed segment; the next report starts a new one."""
        assert self._reports is not None
        self._reports.close()
        self._reports = None
        reports = os.path.dirname(self._report_path)
        seq = max((s for s, _ in report_segments(reports, self.node_id)), default=0) + 1
        os.rename(self._report_path, f"{self._report_path}.{seq}")

    def _ring(self) -> None:
        """Wake the daemon; nobody listening (no daemon, a test) or a full queue is fine, since
        the daemon also reads the reports on its own schedule."""
        try:
            with _socket_path(self._bell_path) as address:
                self._bell.sendto(b"!", address)
        except OSError:
            pass

    def committed_checkpoint(self) -> tuple[int, str]:
        """(step, digest) of the newest committed checkpoint known to the daemon, (0, "") for none."""
        return read_committed_checkpoint(self.directory)

    def report_failure(self, reason: str, generation: int, phase: str = "group", step: int = 0,
                       error: str = "") -> None:
        """The group of `generation` failed at `step`: phase "group" (a collective) or "train"
        (the job's code raised), `error` the exception as one line."""
        self._append({"kind": "failure", "reason": reason, "gen": generation, "phase": phase, "step": step,
                      "error": error or reason})

    def report_job_error(self, error: str) -> None:
        """The job's build raised `error` (one line); the worker exits next."""
        self._append({"kind": "job_error", "phase": "build", "step": 0, "error": error})

    def report_progress(self, step: int, samples: int, loss: float, params_digest: str) -> None:
        self._append({"kind": "progress", "step": step, "samples": samples, "loss": loss, "digest": params_digest},
                     ring=False)

    def report_speed(self, micro_batches_per_s: float) -> None:
        """This box's measured compute speed (micro-batches of the job a second, forward and
        backward alone), sent when it moved by more than the trainer's tolerance."""
        self._append({"kind": "speed", "micro_batches_per_s": micro_batches_per_s}, ring=False)

    def report_event(self, kind: str, **fields: object) -> None:
        """Extra diagnostics (joined, healed, switched) for tests; not part of the protocol."""
        self._append({"kind": kind, **fields})




class ReportTail:
    """The daemon's incremental reader of one worker's reports: sealed segments, then the live
    file, complete lines only, each record once. It follows a file by its inode (a rename while it
    reads loses nothing) and deletes the segments it has read but the newest REPORTS_KEPT."""

    def __init__(self, directory: str, node_id: str) -> None:
        self.node_id = node_id
        self.folder = os.path.join(directory, "reports")
        self.path = os.path.join(self.folder, f"{node_id}.jsonl")
        self._inode: int | None = None  # the file read last, and how far (its complete lines)
        self._offset = 0
        self._read: set[int] = set()  # inodes of the sealed segments read and kept

    def skip_existing(self) -> None:
        """Start after what is already there (reports of an earlier daemon run)."""
        segments = self._segments()
        self._read = {inode for _, inode in segments}
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._inode, self._offset = None, 0
        else:
            self._inode, self._offset = st.st_ino, st.st_size
        self._prune(segments)

    def read_new(self) -> list[dict]:
        """Reports appended since the last call, in order. The live file is opened before the
        sealed segments are listed: one sealed in between is read to its end as a segment."""
        try:
            live = open(self.path, "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            live = None
        try:
            segments = self._segments()
            self._read &= {inode for _, inode in segments}  # forget segments removed by hand
            out: list[dict] = []
            for path, inode in segments:
                if inode not in self._read:
                    with open(path, "rb") as f:
                        out += self._take(f, inode)
                    self._inode, self._offset = None, 0  # sealed: read to its end
                    self._read.add(inode)
            if live is not None:
                inode = os.fstat(live.fileno()).st_ino
                if inode not in self._read:
                    out += self._take(live, inode)
        finally:
            if live is not None:
                live.close()
        if len(segments) > REPORTS_KEPT:
            self._prune(segments)
        return out

    def _segments(self) -> list[tuple[str, int]]:
        """(path, inode) of the sealed segments, oldest first."""
        out = []
        for _, path in report_segments(self.folder, self.node_id):
            try:
                out.append((path, os.stat(path).st_ino))
            except FileNotFoundError:
                continue
        return out

    def _take(self, f: BinaryIO, inode: int) -> list[dict]:
        """The complete lines of an open file after what was read of it."""
        if inode != self._inode:
            self._inode, self._offset = inode, 0
        f.seek(self._offset)
        data = f.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        return _records(data[:end])

    def _prune(self, segments: list[tuple[str, int]]) -> None:
        """Delete the sealed segments read, but the newest REPORTS_KEPT."""
        read = [(path, inode) for path, inode in segments if inode in self._read]
        for path, inode in read[:-REPORTS_KEPT]:
            self._read.discard(inode)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
