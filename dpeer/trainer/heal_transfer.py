"""The heal's data plane: a state's tensors cut into fixed-size pieces, each piece sent by one donor
straight from its live tensors into the receiver's (no flattening copy, no pickling), pieces
shared out over the donors, a checksum on each piece the params digest does not cover.

The state is seen as one byte stream: its tensors in the header's order. Piece ``j`` is bytes
``[j * PIECE_BYTES, (j + 1) * PIECE_BYTES)`` of it, so both sides know from the header alone which
tensor slices a piece holds. A piece is the unit of sharing, of verification, of progress and of
resumption: a receiver whose donor died keeps the pieces that arrived whole and verified.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from dpeer.trainer.decisions import HealPlan
from dpeer.trainer.state import byte_view

PIECE_BYTES = 32 << 20  # big enough that a message's fixed cost vanishes, small enough to resume and show progress
BLOCK = 4096  # bytes per summed block of the piece checksum
DIRECT_SLICES = 8  # a piece of more tensor slices than this travels packed in one staging buffer


class TransferError(RuntimeError):
    """A piece failed its check, or a peer failed mid-transfer."""


@dataclass(frozen=True)
class Slice:
    """Bytes ``[start, end)`` of tensor ``tensor``."""

    tensor: int
    start: int
    end: int


class Layout:
    """Where each piece's bytes lie in the tensors of a state header's specs."""

    def __init__(self, specs: list, unchecked: set[int], piece_bytes: int) -> None:
        """``unchecked``: the tensors the final digest comparison covers (the model's), which need no checksum."""
        if piece_bytes <= 0:
            raise ValueError(f"piece_bytes must be positive, got {piece_bytes}")
        self.sizes = [_numel(shape) * torch.empty(0, dtype=getattr(torch, d)).element_size() for d, shape in specs]
        self.offsets, off = [], 0
        for size in self.sizes:
            self.offsets.append(off)
            off += size
        self.total, self.piece_bytes = off, piece_bytes
        self.n_pieces = -(-off // piece_bytes)
        self._unchecked = unchecked

    def piece_range(self, piece: int) -> tuple[int, int]:
        return piece * self.piece_bytes, min(self.total, (piece + 1) * self.piece_bytes)

    def slices(self, piece: int) -> list[Slice]:
        """The tensor slices piece ``piece`` is made of, in stream order."""
        a, b = self.piece_range(piece)
        out = []
        for i, (off, size) in enumerate(zip(self.offsets, self.sizes)):
            lo, hi = max(a, off), min(b, off + size)
            if lo < hi:
                out.append(Slice(i, lo - off, hi - off))
        return out

    def checked(self, piece: int) -> bool:
        """True when the piece holds bytes the params digest does not cover (it travels with a checksum)."""
        return any(s.tensor not in self._unchecked for s in self.slices(piece))


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a contiguous tensor as a flat uint8 view (no copy)."""
    flat = t.reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)


def _check(views: list[torch.Tensor]) -> int:
    """A piece's checksum: the wrapping int64 sum of every 4 KiB block of each slice (memory speed,
    several times faster than a CRC over the bytes), then a CRC32 over those sums and each slice's
    tail. Any changed word changes its block's sum; a block moved or lost changes the sequence."""
    crc = 0
    for v in views:
        v = v if v.device.type == "cpu" else v.cpu()
        bulk = v.numel() // BLOCK * BLOCK
        if bulk:
            head = v[:bulk]
            if head.storage_offset() % 8 or head.data_ptr() % 8:
                head = head.clone()
            sums = head.view(torch.int64).view(-1, BLOCK // 8).sum(1)
            crc = zlib.crc32(byte_view(sums.view(torch.uint8)), crc)
        crc = zlib.crc32(byte_view(v[bulk:]), crc)
    return crc


def assigned_pieces(plan: HealPlan, receiver: int, missing: list[int], chunks: int) -> list[tuple[int, list[int]]]:
    """(donor, pieces) for one receiver: chunk ``c`` of ``chunks`` is every ``chunks``-th missing
    piece from the c-th, and plan.assignment spreads the chunks over the donors. Strided, not
    contiguous, so every donor sends its share of the model (the stream's head) first and the
    receiver can hash the model while the optimizer state still travels (heal_digest)."""
    out = []
    for donor, first, end in plan.assignment[receiver]:
        pieces = sorted(j for c in range(first, end) for j in missing[c::chunks])
        if pieces:
            out.append((donor, pieces))
    return out


def _schedule(pieces: list[int], checked: Callable[[int], bool]) -> list[tuple[str, int]]:
    """The message order on one donor -> receiver pair: each piece's data, and its checksum one piece
    later, so the donor sums a piece while the next piece is already on the wire."""
    out: list[tuple[str, int]] = []
    pending = None
    for j in pieces:
        out.append(("data", j))
        if pending is not None:
            out.append(("check", pending))
        pending = j if checked(j) else None
    if pending is not None:
        out.append(("check", pending))
    return out


@dataclass
class Transfer:
    """One rank's part of moving the missing pieces from the donors to the receivers.

    ``sources`` (a donor's live tensors) or ``targets`` (a receiver's, written in place); ``done``
    (a receiver's verified pieces) grows as pieces arrive and stays valid if a peer fails."""

    rank: int
    layout: Layout
    device: torch.device
    sources: list[torch.Tensor] | None = None
    targets: list[torch.Tensor] | None = None
    done: set[int] = field(default_factory=set)
    sent: int = 0
    received: int = 0
    _waited: set[int] = field(default_factory=set)
    _failed: set[int] = field(default_factory=set)

    def wait(self, work: object) -> None:
        """Wait for a posted operation once (a Gloo receive waited twice blocks for a second message)."""
        if hasattr(work, "wait") and id(work) not in self._waited:
            self._waited.add(id(work))
            try:
                work.wait()
            except RuntimeError:
                self._failed.add(id(work))
                raise

    def drain(self, works: list) -> None:
        """Wait for every posted operation not yet waited, ignoring failures, so none writes into a
        tensor after the heal gave up."""
        for w in works:
            try:
                self.wait(w)
            except RuntimeError:
                pass

    def _views(self, tensors: list[torch.Tensor], piece: int) -> list[torch.Tensor]:
        return [_bytes(tensors[s.tensor])[s.start : s.end] for s in self.layout.slices(piece)]

    def _direct(self, piece: int) -> bool:
        """A piece of few slices travels as one message per slice, else packed in one (the same
        answer on both sides: it depends on the layout only)."""
        return len(self.layout.slices(piece)) <= DIRECT_SLICES

    def _split(self, staging: torch.Tensor, piece: int) -> list[torch.Tensor]:
        """A packed piece's staging buffer cut back into its slices."""
        out, off = [], 0
        for s in self.layout.slices(piece):
            out.append(staging[off : off + s.end - s.start])
            off += s.end - s.start
        return out

    def _staging(self, piece: int) -> torch.Tensor:
        a, b = self.layout.piece_range(piece)
        return torch.empty(b - a, dtype=torch.uint8, device=self.device)

    def send(self, receiver: int, pieces: list[int]) -> list:
        """Post this donor's pieces for ``receiver``; returns the works to wait on."""
        assert self.sources is not None
        contiguous = [t if t.is_contiguous() else t.contiguous() for t in self.sources]
        works, keep = [], []
        for kind, j in _schedule(pieces, self.layout.checked):
            if kind == "check":
                crc = torch.tensor([_check(self._views(contiguous, j))], dtype=torch.int64, device=self.device)
                keep.append(crc)
                works.append(dist.isend(crc, dst=receiver))
                continue
            views = [v.to(self.device) for v in self._views(contiguous, j)]
            if not self._direct(j):
                views = [torch.cat(views)]
            keep.extend(views)
            for v in views:
                works.append(dist.isend(v, dst=receiver))
            self.sent += sum(v.numel() for v in views)
        works.append(keep)  # the staging and checksum tensors live until their sends are waited on
        return works

    def post_receive(self, donor: int, pieces: list[int]) -> dict[int, tuple[list, list, list]]:
        """Post every receive of ``pieces`` from ``donor``: piece -> (data works, buffers, checksum
        work and buffer). A direct piece lands in the targets themselves where they are on the
        collective device."""
        assert self.targets is not None
        posted: dict[int, tuple[list, list, list]] = {}
        for kind, j in _schedule(pieces, self.layout.checked):
            if kind == "check":
                buf = torch.zeros(1, dtype=torch.int64, device=self.device)
                posted[j][2].extend([dist.irecv(buf, src=donor), buf])
                continue
            if self._direct(j):
                bufs = [v if v.device == self.device else torch.empty(v.numel(), dtype=torch.uint8, device=self.device)
                        for v in self._views(self.targets, j)]
            else:
                bufs = [self._staging(j)]
            posted[j] = ([dist.irecv(b, src=donor) for b in bufs], bufs, [])
        return posted

    def finish_piece(self, piece: int, works: list, bufs: list, crc: list) -> None:
        """Wait for one piece, check it, write it into the targets; raise TransferError if it is wrong."""
        assert self.targets is not None
        for w in works:
            self.wait(w)
        landed = bufs if self._direct(piece) else self._split(bufs[0], piece)
        if crc:
            self.wait(crc[0])
            got = _check(landed)
            if got != int(crc[1].item()):
                raise TransferError(f"piece {piece} arrived corrupt (checksum {got:08x}, the donor's {int(crc[1].item()):08x})")
        for view, part in zip(self._views(self.targets, piece), landed):
            if part is not view:
                view.copy_(part)
        a, b = self.layout.piece_range(piece)
        self.received += b - a
        self.done.add(piece)

    def salvage(self, posted: dict[int, tuple[list, list, list]]) -> None:
        """After a failure: drain every receive, then keep each piece that still arrived whole and
        checks out (a resumed heal fetches only the others)."""
        self.drain([w for entry in posted.values() for w in (*entry[0], *entry[2][:1])])
        for j, entry in posted.items():
            if j not in self.done and not any(id(w) in self._failed for w in (*entry[0], *entry[2][:1])):
                try:
                    self.finish_piece(j, *entry)
                except TransferError:
                    pass
