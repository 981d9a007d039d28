"""Exact sums at float32's wire bytes, for a step where every rank runs at most one micro-batch.

Each bucket's rows (fixedpoint.BUCKET elements each) are cut into one shard per rank (shard_rows:
sizes differing by at most one row, so nothing is padded). The ranks exchange their raw float32
gradients shard by shard (an all-to-all), so each rank owns one shard of every bucket with every
micro-batch's contribution to it. The owner measures each row's largest magnitude over the
contributions, turns every contribution into fixed-point integers with the agreed exponents, sums
them in float64 and turns the sum into the mean gradient (the same fixedpoint functions as the
allreduce path); a second all-to-all hands every rank every owner's means, straight into its
gradient row, and the measured exponents ride in the step's control allreduce (each row's slot
written by its owner alone). The integers are the same numbers as the allreduce path's and an
integer sum is exact in any order, so the result has the same bits as that path and as any world
size.

Why: the float64 allreduce moves 2 x 8 x (w-1)/w bytes a parameter per rank and makes the
collective sum doubles; this moves 2 x 4 x (w-1)/w (a float32 allreduce's bytes) and sums only
the owner's shard.

Memory: a bucket's contributions, then its means (once for every rank), live in one slot of a
pool of SLOTS, each a bucket's float32, from its first exchange until its second has arrived. The
owner sums a bucket when the LAG-th bucket after it is launched; a launch that finds no free slot
waits for the means of the oldest bucket sent back (SLOTS - LAG launches before) and takes its
slot. The sums hold SLOTS buckets beside the gradient row, not two copies of the model. The
contributions are dropped once summed, so when the exponents do not fit (the first step, a gradient
grown past its headroom), the micro-batches run again (exact.py), as on the allreduce path.

Every rank issues the same collectives in the same order, whatever the timing: the first exchange
of each bucket as backward fills it (overlap.py), from the LAG+1-th on each preceded by the second
exchange of the bucket LAG launches older; once every bucket has left, the remaining second
exchanges in bucket order; then the control allreduce (exact_sums.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dpeer.trainer import fixedpoint as fx
from dpeer.trainer.overlap import wait_all

SLOTS = 8  # buckets whose exchanges may be in flight at once: the sums' float32 beside the row
LAG = SLOTS // 2  # buckets launched after one before its owner sums it: its first exchange's head start


def shard_rows(rows: int, world: int) -> list[int]:
    """Each owner's rows of a bucket of ``rows``, in rank order: the first ``rows % world`` one more."""
    base, extra = divmod(rows, world)
    return [base + (r < extra) for r in range(world)]


class ShardedSum:
    """The two exchanges of one group (``world`` ranks, this one ``rank``) over a gradient ``row``
    ([rows, BUCKET], float32), in buckets of rows ``spans`` (launch order)."""

    def __init__(self, row: torch.Tensor, spans: list[tuple[int, int]], rank: int, world: int, lo: int,
                 bits: int, samples: int) -> None:
        self.row, self.spans, self.rank, self.world = row, spans, rank, world
        self.lo, self.bits, self.samples = lo, bits, samples
        self._sizes = [shard_rows(r1 - r0, world) for r0, r1 in spans]
        mine = max((sizes[rank] for sizes in self._sizes), default=0)
        self._slot_rows = world * mine  # every rank's contribution to my largest shard
        self._made = 0
        self._free: list[torch.Tensor] = []
        chunk = min(mine, fx.chunk_rows(torch.float64))
        self._acc = row.new_empty(chunk, row.shape[1], dtype=torch.float64)
        self._wide = row.new_empty(chunk, row.shape[1], dtype=torch.float64)
        self._amax = row.new_empty(world, chunk)
        self._exponents: torch.Tensor | None = None
        self._scale: torch.Tensor | None = None
        self._measured: torch.Tensor | None = None
        self._first: dict[int, tuple[Any, torch.Tensor]] = {}  # bucket -> first exchange, slot (launch order)
        self._second: list[tuple[Any, torch.Tensor]] = []  # second exchanges in flight, their slots

    def begin(self, exponents: torch.Tensor | None, measured: torch.Tensor) -> None:
        """A pass sums with the agreed ``exponents`` (None: not known yet, the means left zero) and
        writes each owned row's measured exponent into its slot of ``measured`` (float64, one a row)."""
        self._exponents, self._measured = exponents, measured
        self._scale = None if exponents is None else fx.pow2(self.bits - exponents).to(self.row.device).view(-1, 1)

    def launch(self, k: int) -> None:
        """Send bucket ``k``'s rows of this rank's gradient to their owners, after summing and sending
        back the oldest bucket not summed when LAG are waiting."""
        if len(self._first) >= LAG:
            self._pass_on(next(iter(self._first)))
        slot, (r0, r1), sizes = self._slot(), self.spans[k], self._sizes[k]
        width, mine = self.row.shape[1], sizes[self.rank]
        work = dist.all_to_all_single(slot[: self.world * mine].view(-1), self.row[r0:r1].reshape(-1),
                                      [mine * width] * self.world, [s * width for s in sizes], async_op=True)
        self._first[k] = (work, slot)

    def finish(self) -> None:
        """Once every bucket has left: the buckets not summed yet, summed and sent back in order."""
        while self._first:
            self._pass_on(next(iter(self._first)))

    def collect(self) -> None:
        """Wait for the owners' means: every bucket's in the row, every slot free again."""
        wait_all([work for work, _ in self._second])
        self._free.extend(slot for _, slot in self._second)
        self._second = []

    @property
    def busy(self) -> bool:
        """Whether exchanges were started and not waited for (a step that failed half-way: its
        buffers may still be written)."""
        return bool(self._second) or bool(self._first)

    def _slot(self) -> torch.Tensor:
        """A free slot: a new one while fewer than SLOTS exist, else the oldest second exchange's,
        once it is done."""
        if self._free:
            return self._free.pop()
        if self._made < SLOTS:
            self._made += 1
            return self.row.new_empty(self._slot_rows, self.row.shape[1])
        wait_all([self._second[0][0]])
        return self._second.pop(0)[1]

    def _pass_on(self, k: int) -> None:
        """Bucket ``k``'s contributions in: this rank's shard summed, its means sent to every rank."""
        work, slot = self._first[k]
        wait_all([work])
        del self._first[k]
        (r0, r1), sizes = self.spans[k], self._sizes[k]
        width, mine = self.row.shape[1], sizes[self.rank]
        part = slot[: self.world * mine].view(self.world, mine, width)
        self._reduce_shard(r0 + sum(sizes[: self.rank]), part)
        self._second.append((dist.all_to_all_single(self.row[r0:r1].reshape(-1), part.view(-1),
                                                    [s * width for s in sizes], [mine * width] * self.world,
                                                    async_op=True), slot))

    def _reduce_shard(self, o0: int, part: torch.Tensor) -> None:
        """The shard of rows from ``o0`` whose contributions are ``part`` ([world, rows, BUCKET]):
        measured exponents, and the mean of the contributions' fixed-point sum (fixedpoint.quantize's
        integers, fixedpoint.finish's means), written over ``part``, once for every rank."""
        exponents, scale, measured = self._exponents, self._scale, self._measured
        assert measured is not None, "a pass's sums before begin()"
        n, means = part.shape[1], part[0]  # a chunk's means overwrite rank 0's contribution once read
        step = max(1, self._acc.shape[0])
        for c0 in range(0, n, step):
            c1 = min(n, c0 + step)
            chunk, rows = part[:, c0:c1], slice(o0 + c0, o0 + c1)
            amax = self._amax[:, : c1 - c0]
            for i in range(self.world):
                fx.bucket_amax(chunk[i], amax[i])
            measured[rows] = fx.bucket_exponents(amax.amax(dim=0), self.lo).to(measured)
            if scale is None or exponents is None:
                means[c0:c1].zero_()
                continue
            acc, wide = self._acc[: c1 - c0], self._wide[: c1 - c0]
            for i in range(self.world):
                target = acc if i == 0 else wide
                target.copy_(chunk[i]).mul_(scale[rows]).round_()
                if i:
                    acc.add_(wide)
            fx.finish(acc, exponents[rows], self.bits, self.samples, means[c0:c1])
        part[1:].copy_(means.expand(self.world - 1, -1, -1))
