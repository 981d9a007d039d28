"""Full training state: capture, flatten into one contiguous buffer plus a small JSON header,
restore; parameter digests; atomic checkpoint files.

The header carries everything that is not a tensor (step, data cursor, RNG states, optimizer
hyper-parameters, tensor specs) in a tagged JSON encoding, so no pickle is ever read from a peer
or a disk. The payload is the raw bytes of every tensor, in order, so it can be sent in chunks.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import importlib
import json
import random
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

from dpeer.channel.checkpoint_files import (  # noqa: F401 (the checkpoint file API, re-exported for the trainer)
    STATE_FORMAT_VERSION,
    STATE_MAGIC,
    STATE_PREFIX,
    StateError,
    checkpoint_path,
    list_checkpoints,
    load_latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    write_checkpoint,
)

MAGIC, FORMAT_VERSION, _PREFIX = STATE_MAGIC, STATE_FORMAT_VERSION, STATE_PREFIX


def _numpy() -> Any:
    """numpy when the job (or torch) has imported it, else None: dpeer itself never needs it, so
    its arrays and RNG state can only exist in a process that loaded it."""
    return sys.modules.get("numpy")


def byte_view(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU uint8 tensor, without a copy and without numpy (which
    ``Tensor.numpy()`` needs but dpeer does not depend on). Keep ``t`` alive while it is used."""
    if t.dtype != torch.uint8 or t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("byte_view takes a contiguous CPU uint8 tensor")
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_ubyte * t.numel()).from_address(t.data_ptr())).cast("B")


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A copy of a tensor's raw bytes (any dtype, any device)."""
    return bytes(byte_view(_as_bytes_view(t)))


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
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    np = _numpy()
    if np is not None and isinstance(obj, np.ndarray):
        return {"__np__": obj.dtype.str, "v": obj.tolist()}
    if np is not None and isinstance(obj, np.generic):
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
        np = _import_numpy("a numpy array")
        return np.asarray(obj["v"], dtype=np.dtype(obj["__np__"]))
    raise StateError(f"unknown tagged object with keys {sorted(obj)}")


def _import_numpy(what: str) -> Any:
    """numpy for a state that holds `what` (only a process with numpy can have written it)."""
    try:
        return importlib.import_module("numpy")
    except ImportError:
        raise StateError(f"the state holds {what} but numpy is not installed here") from None


def _as_bytes_view(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def capture_rng() -> dict[str, Any]:
    """RNG states of torch (and CUDA when available), numpy (when the job loaded it) and ``random``."""
    rng: dict[str, Any] = {
        "torch": tensor_bytes(torch.get_rng_state()),
        "python": random.getstate(),
    }
    np = _numpy()
    if np is not None:
        rng["numpy"] = np.random.get_state()
    if torch.cuda.is_available():
        rng["cuda"] = [tensor_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    """Set every RNG captured by ``capture_rng``."""
    torch.set_rng_state(torch.frombuffer(bytearray(rng["torch"]), dtype=torch.uint8))
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in rng:
        _import_numpy("numpy's RNG state").random.set_state(tuple(rng["numpy"]))
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
        return hashlib.sha256(byte_view(self.payload)).hexdigest()

    def header_bytes(self) -> bytes:
        """The header as canonical UTF-8 JSON."""
        return json.dumps(self.header, sort_keys=True, separators=(",", ":")).encode()

    def to_bytes(self) -> bytes:
        """One contiguous buffer: magic, version, header length, header, payload."""
        head = self.header_bytes()
        return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)) + head + bytes(byte_view(self.payload))

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


@dataclass
class StateParts:
    """A captured state before flattening: the ``header`` (no payload digest) and the state's own
    tensors in the header's order, live (not copies), so a heal can send them where they lie."""

    header: dict[str, Any]
    tensors: list[torch.Tensor]


def _state_tree(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, scaler: Any) -> dict:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
    }


def capture_parts(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
    step: int = 0,
    cursor: int = 0,
) -> StateParts:
    """Model, optimizer, scheduler, grad scaler, RNG states, step and data cursor, without copying
    a tensor: the header plus the live tensors (``flatten`` makes the one-buffer blob of them)."""
    tensors: list[torch.Tensor] = []
    encoded = _encode(_state_tree(model, optimizer, scheduler, scaler), tensors)
    specs = [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors]
    header = {
        "step": int(step),
        "cursor": int(cursor),
        "tree": encoded,
        "tensors": specs,
        "rng": _encode(capture_rng(), []),
        "payload_len": sum(t.numel() * t.element_size() for t in tensors),
        "payload_sha256": "",
    }
    return StateParts(header, [t.detach() for t in tensors])


def flatten(parts: StateParts) -> StateBlob:
    """The blob of ``parts``: every tensor's bytes copied, in order, into one payload, with its digest."""
    views = [_as_bytes_view(t) for t in parts.tensors]
    payload = torch.cat(views) if views else torch.empty(0, dtype=torch.uint8)
    blob = StateBlob(dict(parts.header), payload)
    blob.header["payload_sha256"] = blob.payload_digest()
    return blob


def capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
    step: int = 0,
    cursor: int = 0,
) -> StateBlob:
    """Capture model, optimizer, scheduler, grad scaler, RNG states, step and data cursor."""
    return flatten(capture_parts(model, optimizer, scheduler, scaler, step, cursor))


def _match_live(encoded: Any, live: Any, out: dict[int, torch.Tensor]) -> None:
    """Pair each tensor slot of an encoded tree with the tensor at the same place in a live tree."""
    if isinstance(encoded, dict) and "__t__" in encoded:
        if isinstance(live, torch.Tensor):
            out[encoded["__t__"]] = live
    elif isinstance(encoded, dict) and "__d__" in encoded and isinstance(live, dict):
        for key, value in encoded["__d__"]:
            try:
                k = _decode(key, [])
            except (StateError, IndexError):
                continue
            if isinstance(k, (str, int)) and k in live:
                _match_live(value, live[k], out)
    elif isinstance(encoded, dict) and "__tup__" in encoded and isinstance(live, (tuple, list)):
        for e, v in zip(encoded["__tup__"], live):
            _match_live(e, v, out)
    elif isinstance(encoded, list) and isinstance(live, (tuple, list)):
        for e, v in zip(encoded, live):
            _match_live(e, v, out)


def model_tensor_indices(header: dict[str, Any]) -> set[int]:
    """The tensors of a state header that belong to the model (those the parameter digest covers)."""
    out: set[int] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict) and "__t__" in node:
            out.add(node["__t__"])
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for key, value in header["tree"]["__d__"]:
        if key == "model":  # a module's extra state is not a parameter nor a buffer: not covered
            for name, tensor in value["__d__"]:
                if not str(name).endswith("_extra_state"):
                    walk(tensor)
    return out


def receive_targets(
    header: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
) -> list[torch.Tensor]:
    """Where each tensor of a peer's state header can be received: this process's own live tensor
    at the same place in the state (same dtype, shape and device, contiguous), so a heal writes
    straight into the parameters and optimizer state; a new empty CPU tensor where none fits."""
    live: dict[int, torch.Tensor] = {}
    _match_live(header["tree"], _state_tree(model, optimizer, scheduler, scaler), live)
    out = []
    for i, (dtype_name, shape) in enumerate(header["tensors"]):
        dtype, t = getattr(torch, dtype_name), live.get(i)
        if t is None or t.dtype != dtype or list(t.shape) != shape or not t.is_contiguous():
            t = torch.empty(shape, dtype=dtype)
        out.append(t.detach())
    return out


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
    return restore_parts(StateParts(blob.header, tensors), model, optimizer, scheduler, scaler)


def _aliases_live(received: dict, live: dict) -> bool:
    """True when every tensor of ``received`` is the live one of the same name (already in place)."""
    return received.keys() == live.keys() and all(
        isinstance(v, torch.Tensor) and v.data_ptr() == live[k].data_ptr() and v.shape == live[k].shape
        and v.dtype == live[k].dtype for k, v in received.items())


def restore_parts(
    parts: StateParts,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
) -> tuple[int, int]:
    """Load a state whose tensors are given (and kept: the optimizer holds them); a model whose
    received tensors are its own (``receive_targets``) already holds the values and is not copied."""
    specs = parts.header["tensors"]
    if len(specs) != len(parts.tensors) or any(
            list(t.shape) != shape or str(t.dtype).removeprefix("torch.") != dtype
            for (dtype, shape), t in zip(specs, parts.tensors)):
        raise StateError("the tensors do not match the header's specs")
    tree = _decode(parts.header["tree"], parts.tensors)
    if not _aliases_live(tree["model"], model.state_dict()):
        model.load_state_dict(tree["model"])
    optimizer.load_state_dict(tree["optimizer"])
    if scheduler is not None and tree["scheduler"] is not None:
        scheduler.load_state_dict(tree["scheduler"])
    if scaler is not None and tree["scaler"] is not None:
        scaler.load_state_dict(tree["scaler"])
    restore_rng(_decode(parts.header["rng"], []))
    return int(parts.header["step"]), int(parts.header["cursor"])


def params_digest(model: torch.nn.Module) -> str:
    """sha256 hex over the parameters' raw bytes in ``parameters()`` order, then the buffers' in
    ``buffers()`` order (BatchNorm running statistics included), so replicas whose buffers drifted
    apart are seen too (equal on every replica). A model without buffers digests as before."""
    h = hashlib.sha256()
    for t in _digested(model):
        digest_update(h, t)
    return h.hexdigest()


def _overlapping(tensors: list[torch.Tensor]) -> bool:
    """Whether any two non-empty tensors share a byte of memory."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors if t.numel())
    return any(b_start < a_end for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def _digested(model: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    return (*model.parameters(), *model.buffers())


def digest_later(model: torch.nn.Module) -> Callable[[], str]:
    """params_digest(model) as of now, to compute later on another thread: the parameters are hashed
    where they lie (only an optimizer's step writes them, and the caller waits for the hash before
    one), the buffers from copies taken now (a forward writes BatchNorm's running statistics)."""
    tensors = (*model.parameters(), *(b.detach().clone() for b in model.buffers()))

    def digest() -> str:
        h = hashlib.sha256()
        for t in tensors:
            digest_update(h, t)
        return h.hexdigest()
    return digest


def digest_update(h: Any, t: torch.Tensor) -> None:
    """Feed one tensor's raw bytes to ``h`` as params_digest does."""
    h.update(byte_view(_as_bytes_view(t)))


def digest_order(header: dict[str, Any], targets: list[torch.Tensor], model: torch.nn.Module) -> list[int] | None:
    """The indices in ``header`` of the tensors params_digest hashes, in its order, when each of them
    is received in place (its target is the model's own CPU tensor): hashing those targets as they
    land then gives params_digest(model) after the load, which leaves them as they are. None when
    one is not (a non-persistent buffer, another device, a tensor received into scratch space), and
    when two targets share memory (tied weights, views of one buffer): a later piece of one would
    change bytes already hashed for the other."""
    if _overlapping(targets):
        return None
    placed = {}
    for i in model_tensor_indices(header):
        t = targets[i]
        placed[(t.data_ptr(), t.dtype, tuple(t.shape))] = i
    order = []
    for t in _digested(model):
        i = placed.get((t.data_ptr(), t.dtype, tuple(t.shape)))
        if i is None or t.device.type != "cpu" or not t.is_contiguous():
            return None
        order.append(i)
    return order
