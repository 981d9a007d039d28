"""Full training state: capture, flatten into one contiguous buffer plus a small JSON header,
restore; parameter digests; atomic checkpoint files.

The header carries everything that is not a tensor (step, data cursor, RNG states, optimizer
hyper-parameters, tensor specs) in a tagged JSON encoding, so no pickle is ever read from a peer
or a disk. The payload is the raw bytes of every tensor, in order, so it can be sent in chunks.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import struct
from dataclasses import dataclass
from typing import Any

import torch

try:
    import numpy as _np
except ImportError:  # numpy is optional: its RNG state is captured only when present
    _np = None

MAGIC = b"DPST"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<4sIQ")
CKPT_MAGIC = b"DPCK"
CKPT_PREFIX = "ckpt-"
CKPT_SUFFIX = ".bin"


class StateError(ValueError):
    """A state buffer or checkpoint is malformed or fails its digest."""


def _encode(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return {"__t__": len(tensors) - 1}
    if isinstance(obj, dict):
        return {"__d__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tup__": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if isinstance(obj, bytes):
        return {"__b__": base64.b64encode(obj).decode()}
    if _np is not None and isinstance(obj, _np.ndarray):
        return {"__np__": obj.dtype.str, "v": obj.tolist()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if _np is not None and isinstance(obj, _np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} in a training state header")


def _decode(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__t__" in obj:
        return tensors[obj["__t__"]]
    if "__d__" in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__d__"]}
    if "__tup__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tup__"])
    if "__b__" in obj:
        return base64.b64decode(obj["__b__"])
    if "__np__" in obj:
        if _np is None:
            raise StateError("state holds a numpy array but numpy is not installed")
        return _np.asarray(obj["v"], dtype=_np.dtype(obj["__np__"]))
    raise StateError(f"unknown tagged object with keys {sorted(obj)}")


def _as_bytes_view(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def capture_rng() -> dict[str, Any]:
    """RNG states of torch (and CUDA when available), numpy (when importable) and ``random``."""
    rng: dict[str, Any] = {
        "torch": bytes(torch.get_rng_state().numpy().tobytes()),
        "python": random.getstate(),
    }
    if _np is not None:
        rng["numpy"] = _np.random.get_state()
    if torch.cuda.is_available():
        rng["cuda"] = [bytes(s.numpy().tobytes()) for s in torch.cuda.get_rng_state_all()]
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    """Set every RNG captured by ``capture_rng``."""
    torch.set_rng_state(torch.frombuffer(bytearray(rng["torch"]), dtype=torch.uint8))
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    if _np is not None and "numpy" in rng:
        _np.random.set_state(tuple(rng["numpy"]))
    if "cuda" in rng and torch.cuda.is_available():
        states = [torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in rng["cuda"]]
        torch.cuda.set_rng_state_all(states[: torch.cuda.device_count()])


@dataclass
class StateBlob:
    """A captured state: JSON-able ``header`` and a flat uint8 ``payload`` of all tensor bytes."""

    header: dict[str, Any]
    payload: torch.Tensor

    @property
    def step(self) -> int:
        return int(self.header["step"])

    def payload_digest(self) -> str:
        """sha256 hex of the payload bytes."""
        return hashlib.sha256(self.payload.numpy()).hexdigest()

    def header_bytes(self) -> bytes:
        """The header as canonical UTF-8 JSON."""
        return json.dumps(self.header, sort_keys=True, separators=(",", ":")).encode()

    def to_bytes(self) -> bytes:
        """One contiguous buffer: magic, version, header length, header, payload."""
        head = self.header_bytes()
        return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)) + head + self.payload.numpy().tobytes()

    @classmethod
    def from_parts(cls, header_bytes: bytes, payload: torch.Tensor) -> "StateBlob":
        """Rebuild from a header and a payload received separately; the payload digest is checked."""
        header = json.loads(header_bytes.decode())
        blob = cls(header, payload)
        if payload.numel() != header["payload_len"]:
            raise StateError(f"payload has {payload.numel()} bytes, header says {header['payload_len']}")
        if blob.payload_digest() != header["payload_sha256"]:
            raise StateError("payload digest mismatch")
        return blob

    @classmethod
    def from_bytes(cls, data: bytes) -> "StateBlob":
        """Parse ``to_bytes`` output, verifying magic, version and payload digest."""
        if len(data) < _PREFIX.size:
            raise StateError("state buffer too short")
        magic, version, head_len = _PREFIX.unpack_from(data)
        if magic != MAGIC or version != FORMAT_VERSION:
            raise StateError(f"bad state magic/version {magic!r}/{version}")
        start = _PREFIX.size
        head = data[start : start + head_len]
        payload = torch.frombuffer(bytearray(data[start + head_len :]), dtype=torch.uint8)
        return cls.from_parts(head, payload)


def capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
    step: int = 0,
    cursor: int = 0,
) -> StateBlob:
    """Capture model, optimizer, scheduler, grad scaler, RNG states, step and data cursor."""
    tensors: list[torch.Tensor] = []
    tree = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
    }
    encoded = _encode(tree, tensors)
    views = [_as_bytes_view(t) for t in tensors]
    payload = torch.cat(views) if views else torch.empty(0, dtype=torch.uint8)
    specs = [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors]
    header = {
        "step": int(step),
        "cursor": int(cursor),
        "tree": encoded,
        "tensors": specs,
        "rng": _encode(capture_rng(), []),
        "payload_len": int(payload.numel()),
        "payload_sha256": "",
    }
    blob = StateBlob(header, payload)
    header["payload_sha256"] = blob.payload_digest()
    return blob


def _tensors_from_payload(specs: list, payload: torch.Tensor) -> list[torch.Tensor]:
    out, off = [], 0
    for dtype_name, shape in specs:
        dtype = getattr(torch, dtype_name)
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        chunk = payload[off : off + nbytes].clone()
        out.append(chunk.view(dtype).reshape(shape) if nbytes else torch.empty(shape, dtype=dtype))
        off += nbytes
    if off != payload.numel():
        raise StateError(f"tensor specs cover {off} bytes of a {payload.numel()}-byte payload")
    return out


def restore(
    blob: StateBlob,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
) -> tuple[int, int]:
    """Load a captured state into the given objects (RNGs included); returns (step, cursor)."""
    tensors = _tensors_from_payload(blob.header["tensors"], blob.payload)
    tree = _decode(blob.header["tree"], tensors)
    model.load_state_dict(tree["model"])
    optimizer.load_state_dict(tree["optimizer"])
    if scheduler is not None and tree["scheduler"] is not None:
        scheduler.load_state_dict(tree["scheduler"])
    if scaler is not None and tree["scaler"] is not None:
        scaler.load_state_dict(tree["scaler"])
    restore_rng(_decode(blob.header["rng"], []))
    return int(blob.header["step"]), int(blob.header["cursor"])


def params_digest(model: torch.nn.Module) -> str:
    """sha256 hex over the parameters' raw bytes in ``parameters()`` order, then the buffers' in
    ``buffers()`` order (BatchNorm running statistics included), so replicas whose buffers drifted
    apart are seen too (equal on every replica). A model without buffers digests as before."""
    h = hashlib.sha256()
    for t in (*model.parameters(), *model.buffers()):
        h.update(_as_bytes_view(t).numpy())
    return h.hexdigest()


def _fsync_dir(path: str) -> None:
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
    _fsync_dir(directory)
    return final, digest


def read_checkpoint(path: str, expected_digest: str | None = None) -> bytes:
    """Read a checkpoint, verifying its embedded (and, if given, the expected) digest."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 + 64 or raw[:4] != CKPT_MAGIC:
        raise StateError(f"{path}: not a dpeer checkpoint")
    digest, data = raw[4:68].decode(errors="replace"), raw[68:]
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest or (expected_digest is not None and actual != expected_digest):
        raise StateError(f"{path}: digest mismatch")
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
    committed checkpoint, which a restart after a full power loss resumes from)."""
    for step, path in list_checkpoints(directory)[keep:]:
        if step != protect:
            os.remove(path)
