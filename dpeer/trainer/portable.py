"""Training state in and out of dpeer's checkpoint format, so other tools can use what dpeer
trained and dpeer can start from what other tools trained.

Out: ``model_state`` reads the model's state dict from a dpeer checkpoint (a ``ckpt-*.bin`` file,
or a data dir's newest one that verifies); ``export_model`` writes it as safetensors, as a plain
``torch.save`` state dict, or (model and optimizer) as a torch.distributed.checkpoint directory.
In: ``load_initial`` loads a starting point into a live model (and optimizer) from any of those
but DCP, checking every key and shape first.

Nothing here unpickles arbitrary objects: ``torch.load`` runs with ``weights_only=True`` and a
dpeer checkpoint is JSON plus raw bytes. A DCP directory is not read back, because its
``.metadata`` is a plain pickle. The inputs are only read, never changed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from dpeer.channel.checkpoint_files import CKPT_MAGIC, fsync_dir, list_checkpoints, unwrap_checkpoint
from dpeer.trainer.state import StateBlob, StateError, _decode, _tensors_from_payload, tensor_bytes

FORMATS = ("safetensors", "pt", "dcp")
_SUFFIXES = {".safetensors": "safetensors", ".pt": "pt", ".pth": "pt"}
_MODEL_KEYS = ("model", "state_dict", "model_state_dict")  # where common training scripts keep it
_OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict")
_SHOWN = 5  # keys an error lists of each kind before "and N more"
_ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


@dataclass(frozen=True)
class Checkpoint:
    """A dpeer checkpoint read from disk and verified: its file, the file's sha256, the step it
    holds, its state tree (``model``, ``optimizer``, ``scheduler``, ``scaler``), and the newer
    files of its data dir that were skipped because they did not verify (one reason each)."""

    path: Path
    sha256: str
    step: int
    tree: dict[str, Any] = field(repr=False)
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Exported:
    """What ``export_model`` wrote: where, in which format, from which checkpoint and step, how
    many tensors, its size, and the file's sha256 (None for a DCP directory, a set of files)."""

    out: Path
    format: str
    source: Checkpoint
    tensors: int
    size: int
    sha256: str | None

    @property
    def step(self) -> int:
        """The training step the exported state is from."""
        return self.source.step


# -- reading dpeer checkpoints ------------------------------------------------------------------

def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The dpeer checkpoint at ``path``: a ``ckpt-*.bin`` file, a checkpoints folder, or a data
    dir (its ``checkpoints`` folder), whose newest checkpoint that verifies is taken. StateError
    (a ValueError) in one sentence naming the file for a torn, corrupt or foreign file."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{p} does not exist; give a dpeer data dir or one of its checkpoints/ckpt-*.bin files")
    if p.is_dir():
        return _newest(p)
    return _parse(p, _read(p))


def model_state(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The model's state dict held by the dpeer checkpoint at ``path`` (see ``load_checkpoint``;
    its ``step`` says which step a data dir gave)."""
    return dict(load_checkpoint(path).tree["model"])


def _checkpoints_dir(p: Path) -> Path:
    """The folder holding a data dir's checkpoints (the folder itself when it holds them)."""
    return p / "checkpoints" if (p / "checkpoints").is_dir() else p


def _newest(directory: Path) -> Checkpoint:
    """The newest checkpoint of a data dir (or checkpoints folder) that verifies."""
    found = list_checkpoints(str(_checkpoints_dir(directory)))
    if not found:
        raise StateError(f"{directory} holds no dpeer checkpoint (DATA_DIR/checkpoints/ckpt-*.bin); give a data "
                         "dir whose job has checkpointed, or a checkpoint file")
    skipped: list[str] = []
    for _, file in found:
        try:
            ckpt = _parse(Path(file), _read(Path(file)))
        except (StateError, OSError) as exc:
            skipped.append(str(exc))
            continue
        return Checkpoint(ckpt.path, ckpt.sha256, ckpt.step, ckpt.tree, tuple(skipped))
    raise StateError(f"none of the {len(found)} checkpoints in {directory} verifies (newest: {skipped[0]})")


def _read(p: Path) -> bytes:
    with open(p, "rb") as f:
        return f.read()


def _parse(path: Path, raw: bytes) -> Checkpoint:
    """The checkpoint in a file's bytes, once its digest checks out."""
    try:
        blob = StateBlob.from_bytes(unwrap_checkpoint(raw, str(path)))
    except StateError as exc:
        text = str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}"
        raise StateError(f"{text}: the file is torn, corrupt or not a dpeer checkpoint of this version; "
                         "use another checkpoint (a data dir gives its newest that verifies)") from None
    try:
        tree = _decode(blob.header["tree"], _tensors_from_payload(blob.header["tensors"], blob.payload))
        model = tree["model"]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise StateError(f"{path}: its digest checks out but its state cannot be read ({exc}); it was "
                         "written by another dpeer version or tool") from None
    if not isinstance(model, dict):
        raise StateError(f"{path}: its model state is not a state dict")
    return Checkpoint(path, hashlib.sha256(raw).hexdigest(), blob.step, tree)


# -- writing other formats ----------------------------------------------------------------------

def export_model(source: str | os.PathLike[str], out: str | os.PathLike[str], fmt: str | None = None,
                 force: bool = False) -> Exported:
    """Write the model of the dpeer checkpoint at ``source`` (a data dir or a checkpoint file) to
    ``out``: safetensors, a ``torch.save`` state dict that ``torch.load(out, weights_only=True)``
    loads, or ``dcp``, a torch.distributed.checkpoint directory of ``{"model", "optimizer"}`` (the
    torch state dicts) that other tools resume from. The format is ``fmt``, else ``out``'s suffix
    (.safetensors, .pt, .pth). The file appears whole or not at all (temp file, fsync, rename);
    an existing ``out`` is refused (FileExistsError) unless ``force``."""
    target = Path(out)
    kind = _format_of(target, fmt)
    _refuse_existing(target, force)
    ckpt = load_checkpoint(source)
    if target.resolve() == ckpt.path.resolve():
        raise ValueError(f"{target} is the checkpoint being exported; write the export to another file")
    target.parent.mkdir(parents=True, exist_ok=True)
    model = ckpt.tree["model"]
    if kind == "dcp":
        size = _write_dcp({"model": model, "optimizer": ckpt.tree["optimizer"]}, target, force)
        return Exported(target, kind, ckpt, _count_tensors(ckpt.tree["optimizer"]) + len(model), size, None)
    metadata = {"format": "pt", "dpeer_step": str(ckpt.step), "dpeer_checkpoint_sha256": ckpt.sha256}
    writer: Callable[[Any], None] = ((lambda f: write_safetensors(model, f, metadata)) if kind == "safetensors"
                                     else (lambda f: torch.save(model, f)))
    digest, size = _write_file(target, force, writer)
    return Exported(target, kind, ckpt, len(model), size, digest)


def _format_of(out: Path, fmt: str | None) -> str:
    """The export format: ``fmt`` when given, else the one ``out``'s suffix names; ValueError otherwise."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
        return fmt
    kind = _SUFFIXES.get(out.suffix.lower())
    if kind is None:
        raise ValueError(f"cannot tell the format from {out.name!r}; name it .safetensors, .pt or .pth, or give "
                         f"the format ({', '.join(FORMATS)})")
    return kind


def write_safetensors(tensors: dict[str, torch.Tensor], f: Any, metadata: dict[str, str]) -> None:
    """Write ``tensors`` to the binary file ``f`` in the safetensors format: an 8-byte little-endian
    header length, a JSON header (dtype, shape, byte range of each tensor; ``__metadata__``) padded
    with spaces to 8 bytes, then the tensors' bytes in order. dpeer writes it itself because
    ``safetensors.torch``'s writer needs numpy, which dpeer does not depend on; the tests read
    every file back with the safetensors library."""
    if sys.byteorder != "little":
        raise ValueError("safetensors files are little-endian; export from a little-endian machine")
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.dtype not in _ST_DTYPES:
            what = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name!r} ({what}) cannot be stored in safetensors; export as .pt instead")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    f.write(struct.pack("<Q", len(head)) + head)
    for t in tensors.values():
        f.write(tensor_bytes(t))


def _refuse_existing(out: Path, force: bool) -> None:
    if not force and (out.exists() or out.is_symlink()):
        raise FileExistsError(f"{out} exists; choose another name, or replace it (force)")


def _write_file(out: Path, force: bool, write: Callable[[Any], None]) -> tuple[str, int]:
    """Write a file through ``write`` atomically; returns its sha256 and size."""
    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        digest, size = _sha256_file(tmp), tmp.stat().st_size
        _refuse_existing(out, force)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(str(out.parent))
    return digest, size


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_dcp(state: dict[str, Any], out: Path, force: bool) -> int:
    """Save ``state`` with torch.distributed.checkpoint (one process, no process group) into a
    temp folder, then move it to ``out`` (an old ``out`` is removed only after that, under force);
    returns the bytes written."""
    import torch.distributed.checkpoint as dcp

    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    old = out.parent / f".{out.name}.{os.getpid()}.old"
    try:
        with warnings.catch_warnings():  # one process without a process group is what is meant here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(state, checkpoint_id=str(tmp))
        size = sum(f.stat().st_size for f in tmp.iterdir())
        _refuse_existing(out, force)
        if out.exists() or out.is_symlink():
            os.rename(out, old)
        os.rename(tmp, out)
    finally:
        for leftover in (tmp, old):
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink(missing_ok=True)
    fsync_dir(str(out.parent))
    return size


def _count_tensors(tree: Any) -> int:
    if isinstance(tree, torch.Tensor):
        return 1
    if isinstance(tree, dict):
        return sum(_count_tensors(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_count_tensors(v) for v in tree)
    return 0


# -- loading a starting point -------------------------------------------------------------------

@dataclass(frozen=True)
class _Initial:
    """A starting point read from disk: what it is, its file and sha256, and its state dicts."""

    kind: str
    path: Path
    sha256: str
    model: dict[str, Any]
    optimizer: dict[str, Any] | None


def load_initial(path: str | os.PathLike[str], model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer | None = None) -> str:
    """Load a starting point into ``model`` (and ``optimizer``, when given and the source holds
    optimizer state): a ``torch.save`` state dict (read with ``weights_only=True``; also a dict
    keeping it under "model", "state_dict" or "model_state_dict", with the optimizer's under
    "optimizer" or "optimizer_state_dict"), a safetensors file, or a dpeer checkpoint or data dir.
    Keys saved from a DistributedDataParallel wrapper ("module." prefix) are matched. Every key
    and shape is checked before anything is loaded: ValueError listing the missing, unexpected
    and mismatched keys. Returns one line for the log: format, file, sha256 prefix, tensor count."""
    initial = _read_initial(path)
    state = _unwrapped(initial.model, model)
    _check_fits(state, model, initial.path)
    took = "model only"
    if optimizer is not None and initial.optimizer is not None:  # first: it refuses before it changes anything
        try:
            optimizer.load_state_dict(initial.optimizer)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{initial.path}: its optimizer state does not fit the optimizer ({exc})") from None
        took = "model and optimizer"
    model.load_state_dict(state)
    return f"{initial.kind} {initial.path} sha256 {initial.sha256[:12]}: {len(state)} tensors, {took}"


def _read_initial(path: str | os.PathLike[str]) -> _Initial:
    """Read a starting point's state dicts, the file read once (what is hashed is what is loaded)."""
    p = Path(path)
    if p.is_dir() and (p / ".metadata").is_file():
        raise ValueError(f"{p} is a torch.distributed.checkpoint folder, which dpeer does not read (its .metadata "
                         "is a pickle); convert it where you trust it (torch.distributed.checkpoint.format_utils."
                         "dcp_to_torch_save) and give the .pt")
    if p.is_dir():
        ckpt = load_checkpoint(p)
        return _Initial(f"dpeer checkpoint (step {ckpt.step})", ckpt.path, ckpt.sha256, ckpt.tree["model"],
                        ckpt.tree["optimizer"])
    if not p.is_file():
        raise ValueError(f"{p} does not exist or is not a file; give a .pt, .safetensors or dpeer checkpoint")
    raw = _read(p)
    if raw.startswith(CKPT_MAGIC):
        ckpt = _parse(p, raw)
        return _Initial(f"dpeer checkpoint (step {ckpt.step})", p, ckpt.sha256, ckpt.tree["model"],
                        ckpt.tree["optimizer"])
    digest = hashlib.sha256(raw).hexdigest()
    if raw.startswith(b"PK\x03\x04") or raw[:1] == b"\x80":  # torch.save's zip, or its legacy pickle
        found, optimizer = _torch_state(p, raw)
        return _Initial("torch.save", p, digest, found, optimizer)
    if raw[8:9] == b"{":
        return _Initial("safetensors", p, digest, _safetensors_state(p, raw), None)
    raise ValueError(f"{p} is not a torch.save file, a safetensors file nor a dpeer checkpoint")


def _torch_state(p: Path, raw: bytes) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The model (and optimizer) state dicts of a torch.save file, unpickling only tensors and plain data."""
    try:
        obj = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch reports a refused or broken pickle with many exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{p} cannot be loaded with torch.load(weights_only=True): {first}; save a state dict "
                         "(model.state_dict()), not a pickled object") from None
    if isinstance(obj, dict):
        for key in _MODEL_KEYS:
            if isinstance(obj.get(key), dict):
                optimizer = next((obj[k] for k in _OPTIMIZER_KEYS if isinstance(obj.get(k), dict)), None)
                return obj[key], optimizer
        if obj and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
            return obj, None
    raise ValueError(f"{p} holds a {type(obj).__name__}, not a state dict (names to tensors, or one kept "
                     f"under {', '.join(repr(k) for k in _MODEL_KEYS)})")


def _safetensors_state(p: Path, raw: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file's bytes (the safetensors library checks its layout)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(raw)
    except (SafetensorError, ValueError, KeyError) as exc:
        raise ValueError(f"{p} is not a valid safetensors file ({exc})") from None


def _unwrapped(state: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """``state`` without the "module." prefix a DistributedDataParallel wrapper adds, when every key
    has it and the model's keys do not."""
    prefix = "module."
    own = model.state_dict()
    if state and all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in own):
        return {k[len(prefix):]: v for k, v in state.items()}
    return state


def _check_fits(state: dict[str, Any], model: torch.nn.Module, where: Path) -> None:
    """ValueError naming ``where`` and listing the missing, unexpected and shape-mismatched keys,
    unless ``state`` has exactly the model's keys, each tensor of the model's shape."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    mismatched = [f"{k} {_shape(state[k])} vs the model's {list(own[k].shape)}" for k in own
                  if k in state and isinstance(own[k], torch.Tensor) and _shape(state[k]) != list(own[k].shape)]
    problems = [f"{label} {_listed(keys)}" for label, keys in
                (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", mismatched)) if keys]
    if problems:
        raise ValueError(f"{where} does not fit the model: {'; '.join(problems)}")


def _shape(value: Any) -> list[int] | str:
    return list(value.shape) if isinstance(value, torch.Tensor) else f"(a {type(value).__name__})"


def _listed(keys: list[str]) -> str:
    more = f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else ""
    return ", ".join(keys[:_SHOWN]) + more
