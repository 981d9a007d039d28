"""What the ranks of an exact step (exact.py) agree on: the per-bucket exponents of the next step,
the control slots of the step's allreduce that carry what each rank measured, and the pass over
the micro-batches that fills them."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch

from dpeer.trainer import fixedpoint as fx
from dpeer.trainer.exact_buffers import NormBuffers
from dpeer.trainer.state import tensor_bytes


class Exponents:
    """The per-bucket exponents E the group agreed for the next step (None: not known yet, the step
    measures them), their fingerprint (crc32, -1: none; ranks compare it in the allreduce) and the
    scales 2**(bits - E) that quantize with them."""

    def __init__(self, bits: int, dtype: torch.dtype, device: torch.device, lo: int, hi: int) -> None:
        self.bits, self.dtype, self.device, self.lo, self.hi = bits, dtype, device, lo, hi
        self.values: torch.Tensor | None = None
        self.fingerprint = -1
        self.scale: torch.Tensor | None = None

    def set(self, exponents: torch.Tensor | None) -> None:
        """Agree on the next step's exponents; their fingerprint and scales are kept with them."""
        self.values = exponents
        self.fingerprint = -1 if exponents is None else zlib.crc32(tensor_bytes(exponents))
        self.scale = None if exponents is None else fx.scales(exponents, self.bits, self.dtype, self.device)

    def advance(self, measured: torch.Tensor, used: torch.Tensor) -> None:
        """A step summed with ``used`` measured ``measured``: the next step's exponents."""
        self.set(fx.next_exponents(measured, used, self.lo, self.hi))

    def fitting(self, measured: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Exponents for a redo that fit the ``measured`` ones (within range), and their scales."""
        used = measured.clamp(min=self.lo, max=self.hi)
        return used, fx.scales(used, self.bits, self.dtype, self.device)

    def state(self) -> dict[str, Any]:
        """The agreed exponents: part of the training state, so a healed or resumed replica sums the
        way its peers and a fault-free run do."""
        return {"exponents": None if self.values is None else self.values.tolist()}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Take the exponents of a captured state (None: unknown, the next step measures them)."""
        values = (state or {}).get("exponents")
        self.set(None if values is None else torch.tensor(values, dtype=torch.int64))


@dataclass(frozen=True)
class Pass:
    """One pass over this rank's micro-batches of a step: the exponents it quantizes with and their
    scales (None: it only measures), whether its last micro-batch's buckets launch as backward fills
    them, its largest magnitudes ([micro-batches, buckets]), how many micro-batches it runs, the
    rank, and what the rank's control slots carry besides its measured exponents (the agreed
    exponents' fingerprint, the newest generation it has seen)."""

    exponents: torch.Tensor | None
    scale: torch.Tensor | None
    overlap: bool
    amax: torch.Tensor
    count: int
    rank: int
    fingerprint: int
    newest: int


class ControlSlots:
    """The control slots of a group of ``world`` ranks, the front of the step's allreduce buffer:
    [M losses | per rank: nb exponents, fingerprint, flag, newest | M*norms], the gradients' integers
    after them from ``grads`` to ``end``."""

    def __init__(self, micro: int, nb: int, norm_numel: int, world: int, device: torch.device) -> None:
        self.micro, self.nb, self.norm_numel, self.device = micro, nb, norm_numel, device
        self.ranks = micro  # the losses come first
        self.norm = self.ranks + world * (nb + 3)
        self.grads = self.norm + micro * norm_numel
        self.end = self.grads + nb * fx.BUCKET
        self.buf = torch.zeros(self.grads, dtype=torch.float64, device=device)

    def norm_slots(self, buf: torch.Tensor) -> torch.Tensor:
        """The per-micro-batch norm statistics of ``buf`` (these slots, or a copy): [M, norm numel]."""
        return buf[self.norm : self.grads].view(self.micro, self.norm_numel)

    def write_sample(self, j: int, loss: torch.Tensor, norms: NormBuffers) -> None:
        """Micro-batch ``j``'s loss and the norm statistics its forward left."""
        self.buf[j] = float(loss.detach()) + 0.0
        if norms.buffers:
            norms.write(self.norm_slots(self.buf)[j])

    def write_rank(self, rank: int, measured: torch.Tensor, fingerprint: int, grew: bool, newest: int) -> None:
        """This rank's slots: its measured exponents, the exponents' fingerprint, whether a gradient
        outgrew its exponent, and the newest generation it has seen."""
        block = self._block(rank)
        self.buf[block : block + self.nb] = measured.to(self.device)
        self.buf[block + self.nb : block + self.nb + 3] = torch.tensor([float(fingerprint), float(grew), float(newest)],
                                                                       dtype=torch.float64)

    def write_marks(self, rank: int, fingerprint: int, newest: int) -> None:
        """This rank's fingerprint and newest generation (a sharded pass: the owners write the
        measured exponents, into rank 0's block)."""
        block = self._block(rank)
        self.buf[block + self.nb] = float(fingerprint)
        self.buf[block + self.nb + 2] = float(newest)

    def owners_measured(self) -> torch.Tensor:
        """Rank 0's measured slots, where a sharded pass's owners write every row's exponent."""
        return self.buf[self.ranks : self.ranks + self.nb]

    def read(self, tail: torch.Tensor, world: int, samples: int) -> tuple[torch.Tensor, set[float], list[int], float]:
        """The reduced control slots ``tail``: every rank's block, the exponents' fingerprints, the
        newest generations seen, the step's mean loss over ``samples``."""
        ranks = tail[self.ranks : self.norm].view(world, self.nb + 3)
        seen = [int(v) for v in ranks[:, self.nb + 2].tolist()]
        return ranks, set(ranks[:, self.nb].tolist()), seen, sum(tail[: self.micro].tolist()) / samples

    def _block(self, rank: int) -> int:
        return self.ranks + rank * (self.nb + 3)
