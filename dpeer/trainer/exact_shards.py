"""Exact sums at float32's wire bytes, for a step where every rank runs at most one micro-batch.

Each bucket's rows (fixedpoint.BUCKET elements each) are cut into one shard per rank. The ranks
exchange their raw float32 gradients shard by shard (an all-to-all), so each rank owns one shard of
every bucket with every micro-batch's contribution to it. The owner measures each row's largest
magnitude over the contributions, turns every contribution into fixed-point integers with the
agreed exponents, sums them in float64 and turns the sum into the mean gradient (the same
fixedpoint functions as the allreduce path); a second all-to-all hands every rank every owner's
means, straight into its gradient row, and the measured exponents ride in the step's control
allreduce (each row's slot written by its owner alone). The integers are the same numbers as the allreduce path's and an
integer sum is exact in any order, so the result has the same bits as that path and as any world
size.

Why: the float64 allreduce moves 2 x 8 x (w-1)/w bytes a parameter per rank and makes the
collective sum doubles; this moves 2 x 4 x (w-1)/w (a float32 allreduce's bytes) and sums only
the owner's shard. When the exponents do not fit, the owners sum the contributions they kept
again with the measured exponents: no micro-batch is recomputed.

Every rank issues the same collectives in the same order: the first exchange of each bucket as
backward fills it (overlap.py), then, once every bucket has left, the second exchanges in bucket
order, then the control allreduce (exact.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dpeer.trainer import fixedpoint as fx
from dpeer.trainer.overlap import wait_all


class ShardedSum:
    """The two exchanges of one group (``world`` ranks, this one ``rank``) over a gradient ``row``
    ([rows, BUCKET], float32), in buckets of rows ``spans`` (launch order)."""

    def __init__(self, row: torch.Tensor, spans: list[tuple[int, int]], rank: int, world: int, lo: int,
                 bits: int, samples: int) -> None:
        self.row, self.spans, self.rank, self.world = row, spans, rank, world
        self.lo, self.bits, self.samples = lo, bits, samples
        width = row.shape[1]
        self._shard = [-(-(r1 - r0) // world) for r0, r1 in spans]  # S: rows an owner takes of bucket k
        self._recv = [row.new_empty(world, s, width) for s in self._shard]  # every rank's contribution to my shard
        self._send = [row.new_empty(world, s, width) for s in self._shard]  # my shard's means, once for every rank
        # a bucket whose rows do not split evenly travels padded to world * S rows
        self._pad = {k: row.new_zeros(world * s, width) for k, s in enumerate(self._shard)
                     if world * s != spans[k][1] - spans[k][0]}
        chunk = min(max(self._shard, default=0), fx.chunk_rows(torch.float64))
        self._acc = row.new_empty(chunk, width, dtype=torch.float64)
        self._wide = row.new_empty(chunk, width, dtype=torch.float64)
        self._amax = row.new_empty(world, chunk)
        self._first: list[Any] = []
        self._second: list[Any] = []

    def launch(self, k: int) -> None:
        """Send bucket ``k``'s rows of this rank's gradient to their owners."""
        r0, r1 = self.spans[k]
        src = self.row[r0:r1]
        if k in self._pad:
            self._pad[k][: r1 - r0].copy_(src)
            src = self._pad[k]
        self._first.append(dist.all_to_all_single(self._recv[k].view(-1), src.reshape(-1), async_op=True))

    def sum(self, exponents: torch.Tensor | None, measured: torch.Tensor | None) -> None:
        """Once every bucket has left: each bucket's shard summed with the agreed ``exponents`` (None:
        not known yet, the means left zero) and handed back, in bucket order; the shard's measured
        exponents into its rows' slots of ``measured`` (float64, one a row; None: not wanted)."""
        scale = None if exponents is None else fx.pow2(self.bits - exponents).to(self.row.device).view(-1, 1)
        for k in range(len(self.spans)):
            if k < len(self._first) and self._first[k] is not None:
                wait_all([self._first[k]])
                self._first[k] = None
            self._reduce_shard(k, exponents, scale, measured)
            back = self._pad[k] if k in self._pad else self.row[self.spans[k][0] : self.spans[k][1]]
            self._second.append(dist.all_to_all_single(back.reshape(-1), self._send[k].view(-1), async_op=True))
        self._first = []

    def collect(self) -> None:
        """Wait for the owners' means: every bucket's in the row."""
        works, self._second = self._second, []
        wait_all(works)
        for k, pad in self._pad.items():
            r0, r1 = self.spans[k]
            self.row[r0:r1].copy_(pad[: r1 - r0])

    @property
    def busy(self) -> bool:
        """Whether exchanges were started and not waited for (a step that failed half-way: its
        buffers may still be written)."""
        return bool(self._second) or any(w is not None for w in self._first)

    def _reduce_shard(self, k: int, exponents: torch.Tensor | None, scale: torch.Tensor | None,
                      measured: torch.Tensor | None) -> None:
        """This rank's shard of bucket ``k``: measured exponents, and the mean of the contributions'
        fixed-point sum (fixedpoint.quantize's integers, fixedpoint.finish's means), once for every rank."""
        r0, r1 = self.spans[k]
        s = self._shard[k]
        o0 = r0 + self.rank * s
        n = max(0, min(r1, o0 + s) - o0)
        means = self._send[k][0]
        step = max(1, self._acc.shape[0])
        for c0 in range(0, n, step):
            c1 = min(n, c0 + step)
            part, rows = self._recv[k][:, c0:c1], slice(o0 + c0, o0 + c1)
            if measured is not None:
                amax = self._amax[:, : c1 - c0]
                for i in range(self.world):
                    fx.bucket_amax(part[i], amax[i])
                measured[rows] = fx.bucket_exponents(amax.amax(dim=0), self.lo).to(measured)
            if scale is None or exponents is None:
                means[c0:c1].zero_()
                continue
            acc, wide = self._acc[: c1 - c0], self._wide[: c1 - c0]
            for i in range(self.world):
                target = acc if i == 0 else wide
                target.copy_(part[i]).mul_(scale[rows]).round_()
                if i:
                    acc.add_(wide)
            fx.finish(acc, exponents[rows], self.bits, self.samples, means[c0:c1])
        means[n:].zero_()
        self._send[k][1:].copy_(means.expand(self.world - 1, -1, -1))
