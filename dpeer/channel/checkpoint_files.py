"""Checkpoint files on disk and the header of the state they hold, without torch: the worker
writes and reads them (trainer/state.py), the daemon serves and fetches them (a box that returns
after its job ended takes the final state from a holder).

A file is ``DPCK`` + the sha256 hex of the data + the data, written atomically (temp file, fsync,
rename, fsync of the folder). The data is a state blob: ``DPST``, a format version, the header
length, the JSON header, then the raw tensor bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Any

CKPT_MAGIC = b"DPCK"
CKPT_PREFIX = "ckpt-"
CKPT_SUFFIX = ".bin"
STATE_MAGIC = b"DPST"
STATE_FORMAT_VERSION = 1
STATE_PREFIX = struct.Struct("<4sIQ")
_DIGEST_HEX = 64


class StateError(ValueError):
    """A state buffer or checkpoint is malformed or fails its digest."""


def fsync_dir(path: str) -> None:
    """Make a rename or a new file in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_path(directory: str, step: int) -> str:
    """The final file name of the checkpoint of ``step`` in ``directory``."""
    return os.path.join(directory, f"{CKPT_PREFIX}{step:012d}{CKPT_SUFFIX}")


def write_checkpoint(directory: str, step: int, data: bytes) -> tuple[str, str]:
    """Write atomically (temp file, fsync, rename, fsync dir); returns (path, sha256 hex of data)."""
    os.makedirs(directory, exist_ok=True)
    digest = hashlib.sha256(data).hexdigest()
    final = checkpoint_path(directory, step)
    tmp = os.path.join(directory, f".{os.path.basename(final)}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(CKPT_MAGIC + digest.encode() + data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_dir(directory)
    return final, digest


def read_checkpoint(path: str, expected_digest: str | None = None) -> bytes:
    """Read a checkpoint, verifying its embedded (and, if given, the expected) digest."""
    with open(path, "rb") as f:
        return unwrap_checkpoint(f.read(), path, expected_digest)


def unwrap_checkpoint(raw: bytes, where: str, expected_digest: str | None = None) -> bytes:
    """The state blob inside a checkpoint file's bytes, once its embedded (and, if given, the
    expected) sha256 checks out; StateError naming `where` otherwise."""
    head = len(CKPT_MAGIC) + _DIGEST_HEX
    if len(raw) < head or raw[: len(CKPT_MAGIC)] != CKPT_MAGIC:
        raise StateError(f"{where}: not a dpeer checkpoint")
    digest, data = raw[len(CKPT_MAGIC) : head].decode(errors="replace"), raw[head:]
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest or (expected_digest is not None and actual != expected_digest):
        raise StateError(f"{where}: digest mismatch")
    return data


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """(step, path) of finished checkpoint files, newest first; temp files are ignored."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        if name.startswith(CKPT_PREFIX) and name.endswith(CKPT_SUFFIX):
            core = name[len(CKPT_PREFIX) : -len(CKPT_SUFFIX)]
            if core.isdigit():
                found.append((int(core), os.path.join(directory, name)))
    return sorted(found, reverse=True)


def load_latest_checkpoint(directory: str) -> tuple[int, bytes] | None:
    """The newest checkpoint that verifies, as (step, data); corrupt files are skipped."""
    for step, path in list_checkpoints(directory):
        try:
            return step, read_checkpoint(path)
        except (StateError, OSError):
            continue
    return None


def prune_checkpoints(directory: str, keep: int, protect: int = 0) -> None:
    """Delete all but the ``keep`` newest checkpoints and the one of step ``protect`` (the newest
    committed checkpoint, which a restart after a full power loss resumes from), and the temp
    files of writes whose process is gone (killed mid-write: each as big as a checkpoint)."""
    for step, path in list_checkpoints(directory)[keep:]:
        if step != protect:
            os.remove(path)
    for name in os.listdir(directory):
        pid = _writer(name)
        if pid is not None and not _alive(pid):
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass  # another pruner took it


def _writer(name: str) -> int | None:
    """The pid in a checkpoint temp file's name (``.ckpt-<step>.bin.<pid>.tmp``), None for any other file."""
    if not (name.startswith("." + CKPT_PREFIX) and name.endswith(".tmp")):
        return None
    pid = name[: -len(".tmp")].rsplit(".", 1)[-1]
    return int(pid) if pid.isdigit() else None


def _alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def read_state_header(data: bytes) -> dict[str, Any]:
    """The JSON header of a state blob (step, params_digest, ...); StateError when malformed."""
    if len(data) < STATE_PREFIX.size:
        raise StateError("state buffer too short")
    magic, version, head_len = STATE_PREFIX.unpack_from(data)
    if magic != STATE_MAGIC or version != STATE_FORMAT_VERSION:
        raise StateError(f"bad state magic/version {magic!r}/{version}")
    try:
        header = json.loads(data[STATE_PREFIX.size : STATE_PREFIX.size + head_len].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateError(f"state header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise StateError("state header is not a JSON object")
    return header
