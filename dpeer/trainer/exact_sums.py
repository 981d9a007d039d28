"""How an exact step's sums (exact.py) travel in a group of one size: the control slots and the
overlap buckets over ``[control | gradients]`` (overlap.py), and one of two paths for the pass's
fixed-point sums, each issuing the same collectives in the same order on every rank.

WireSums: the float64 allreduce of each bucket's integers, the control slots in the bucket at the
front (launched last). A rank with one micro-batch (or none) converts each bucket into a wire
buffer of a bucket's size from a pool of WIRE_SLOTS and turns each sum back into the mean gradient
as soon as it returns, which frees the buffer for the next bucket; a rank with several sums them in
one float64 buffer of the model's size, which its buckets then reduce.

ShardSums: a step where every rank runs at most one micro-batch is summed by the owners of the
buckets' shards from the raw float32 gradients (exact_shards.py), then the control slots alone are
summed by an allreduce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dpeer.trainer import fixedpoint as fx
from dpeer.trainer.exact_control import ControlSlots, Pass
from dpeer.trainer.exact_shards import ShardedSum
from dpeer.trainer.overlap import Bucket, Overlap, plan_buckets, wait_all

if TYPE_CHECKING:
    from dpeer.trainer.exact import ExactStep

WIRE_SLOTS = 8  # bucket-sized float64 wire buffers a rank with one micro-batch keeps (32 MiB of BUCKET_BYTES)


def _rows(bucket: Bucket, grads: int) -> tuple[int, int]:
    """The gradient rows [r0, r1) of ``bucket`` in a buffer whose gradients start at ``grads``."""
    return max(bucket.lo - grads, 0) // fx.BUCKET, (bucket.hi - grads) // fx.BUCKET


class WireSums:
    """The allreduce path over the gradient ``row`` ([nb, BUCKET]) in the buckets of ``plan``."""

    def __init__(self, row: torch.Tensor, wide: torch.Tensor | None, control: ControlSlots, plan: list[Bucket],
                 lo: int, bits: int, samples: int) -> None:
        self.row, self.wide, self.control, self.plan = row, wide, control, plan
        self.lo, self.bits, self.samples = lo, bits, samples
        self._acc: torch.Tensor | None = None  # [control | grads] sums of a rank with several micro-batches
        self._slots: list[torch.Tensor] = []  # free bucket-sized wire buffers of a rank with one micro-batch
        self._works: list[tuple[Any, Bucket, torch.Tensor, torch.Tensor | None]] = []  # work, bucket, wire, slot
        self._tail: torch.Tensor | None = None  # the reduced control slots, on the CPU
        self._pass: Pass | None = None

    def begin(self, p: Pass) -> None:
        """A pass starts: the whole-model sum of a rank with several micro-batches, fresh wire buffers
        after a step that failed half-way (its buffers may still be written)."""
        if p.count > 1 and self._acc is None:
            self._acc = torch.zeros(self.control.end, dtype=torch.float64, device=self.control.device)
        if self._works:
            self._works, self._slots = [], []
        self._tail, self._pass = None, p

    def grads_sum(self) -> torch.Tensor | None:
        """The gradient rows of the whole-model sum ([nb, BUCKET]; None on a rank with one micro-batch)."""
        return None if self._acc is None else self._acc[self.control.grads :].view(self.control.nb, fx.BUCKET)

    def launch(self, _k: int, bucket: Bucket) -> None:
        """Start one bucket's allreduce; its slice of the last micro-batch's gradient is first measured
        and quantized into the sum (into a pooled wire buffer on a rank with one micro-batch or none)
        when the pass overlaps or the rank has one micro-batch at most. The bucket at the front
        carries the control slots, written once every other bucket's largest magnitudes are known."""
        p = self._pass
        assert p is not None, "launch() before begin()"
        convert, last, g = p.overlap or p.count <= 1, p.count - 1, self.control.grads
        r0, r1 = _rows(bucket, g)
        slot = self._slot() if self._acc is None or p.count <= 1 else None
        wire = self._acc[bucket.lo : bucket.hi] if slot is None else slot[: bucket.hi - bucket.lo]
        grads = wire[max(g - bucket.lo, 0) :].view(r1 - r0, fx.BUCKET)
        if convert and last >= 0 and r1 > r0:
            fx.quantize(self.row[r0:r1], None if p.scale is None else p.scale[r0:r1], p.amax[last, r0:r1],
                        grads, self.wide, first=last == 0)
        elif convert and r1 > r0 and p.scale is not None:
            grads.zero_()  # a rank with no micro-batch adds zeros
        if bucket.lo == 0:
            measured = fx.bucket_exponents(p.amax.amax(dim=0), self.lo)
            grew = p.exponents is None or bool((measured > p.exponents.to(measured.device)).any())
            self.control.write_rank(p.rank, measured, p.fingerprint, grew, p.newest)
            wire[:g].copy_(self.control.buf)
        self._works.append((dist.all_reduce(wire, async_op=True), bucket, wire, slot))

    def end(self) -> None:
        """Every bucket has left: the control slots went with the front one."""

    def wait(self) -> None:
        """Wait for every bucket's sum, each turned into the mean gradient of its rows."""
        while self._works:
            self._complete_oldest()

    def tail(self) -> torch.Tensor:
        """The pass's reduced control slots (on the CPU), once ``wait`` returned."""
        assert self._tail is not None, "reduce() before end_pass()"
        tail, self._tail = self._tail, None
        return tail

    def measured(self, ranks: torch.Tensor) -> torch.Tensor:
        """The group's measured exponents: the largest of the ranks' (each measured its own gradients)."""
        return ranks[:, : self.control.nb].to(torch.int64).amax(dim=0)

    def outgrew(self, ranks: torch.Tensor, _measured: torch.Tensor, _used: torch.Tensor) -> bool:
        """Whether a rank's gradient outgrew the exponents it was quantized with (its flag)."""
        return float(ranks[:, self.control.nb + 1].sum()) > 0

    def _slot(self) -> torch.Tensor:
        """A free wire buffer of the longest bucket's size: a new one while fewer than WIRE_SLOTS are
        in use, else the oldest bucket in flight's, once its sum is back and finished."""
        while not self._slots:
            if sum(slot is not None for *_, slot in self._works) < WIRE_SLOTS:
                longest = max(b.hi - b.lo for b in self.plan)
                self._slots.append(torch.zeros(longest, dtype=torch.float64, device=self.control.device))
            else:
                self._complete_oldest()
        return self._slots.pop()

    def _complete_oldest(self) -> None:
        """Wait for the oldest bucket in flight; its sum (when the pass quantized) into the mean
        gradient of its rows, at once: a later redo recomputes every row, so nothing is lost if the
        step's exponents turn out not to fit. The front bucket's control slots are kept."""
        work, bucket, wire, slot = self._works.pop(0)
        wait_all([work])
        g = self.control.grads
        if bucket.lo == 0:
            self._tail = wire[:g].to("cpu", copy=True)
        assert self._pass is not None
        exponents, scale = self._pass.exponents, self._pass.scale
        r0, r1 = _rows(bucket, g)
        if scale is not None and exponents is not None and r1 > r0:
            grads = wire[max(g - bucket.lo, 0) :].view(r1 - r0, fx.BUCKET)
            fx.finish(grads, exponents[r0:r1], self.bits, self.samples, self.row[r0:r1])
        if slot is not None:
            self._slots.append(slot)


class ShardSums:
    """The owners' path over the gradient ``row`` in a group of ``world``: the owners' sums
    (exact_shards.ShardedSum, in the buckets of ``plan``), then the control slots' allreduce."""

    def __init__(self, row: torch.Tensor, control: ControlSlots, plan: list[Bucket], world: int, lo: int,
                 bits: int, samples: int) -> None:
        self.row, self.control, self.plan, self.world = row, control, plan, world
        self.lo, self.bits, self.samples = lo, bits, samples
        self.owners: ShardedSum | None = None
        self._work: Any = None  # the control slots' allreduce
        self._pass: Pass | None = None

    def begin(self, p: Pass) -> None:
        """A pass starts: this rank's exchanges (fresh ones after a step that failed half-way), and a
        zero gradient for a rank with no micro-batch."""
        self._work, self._pass = None, p
        if self.owners is None or self.owners.rank != p.rank or self.owners.busy:
            spans = [_rows(b, self.control.grads) for b in self.plan]
            self.owners = ShardedSum(self.row, spans, p.rank, self.world, self.lo, self.bits, self.samples)
        self.owners.begin(p.exponents, self.control.owners_measured())
        if not p.count:
            self.row.zero_()

    def grads_sum(self) -> None:
        """No whole-model sum: a rank runs one micro-batch at most."""

    def launch(self, k: int, _bucket: Bucket) -> None:
        """Send bucket ``k``'s rows to their owners (exact_shards.py)."""
        assert self.owners is not None
        self.owners.launch(k)

    def end(self) -> None:
        """Every bucket has left: the owners' remaining sums, then the control slots (this rank's
        fingerprint and newest generation, the owners' measured exponents, losses and norm
        statistics) summed."""
        assert self.owners is not None and self._pass is not None
        self.control.write_marks(self._pass.rank, self._pass.fingerprint, self._pass.newest)
        self.owners.finish()
        self._work = dist.all_reduce(self.control.buf, async_op=True)

    def wait(self) -> None:
        """Wait for the control slots' sum and the owners' means (into the row)."""
        assert self.owners is not None and self._work is not None, "reduce() before end_pass()"
        work, self._work = self._work, None
        wait_all([work])
        self.owners.collect()

    def tail(self) -> torch.Tensor:
        """The reduced control slots, on the CPU."""
        return self.control.buf.to("cpu", copy=True)

    def measured(self, ranks: torch.Tensor) -> torch.Tensor:
        """The owners' measured exponents (rank 0's slots, each row's written by its owner)."""
        return ranks[0, : self.control.nb].to(torch.int64)

    def outgrew(self, _ranks: torch.Tensor, measured: torch.Tensor, used: torch.Tensor) -> bool:
        """Whether a gradient outgrew the exponents it was summed with."""
        return bool((measured > used).any())


class GroupSums:
    """The sums of ``step`` (exact.ExactStep) in a group of ``world`` ranks: its control slots, the
    buckets planned over them and the gradients, the path the sums take (ShardSums when ``sharded``,
    else WireSums) and the hooks that launch the buckets as the last backward fills them (none when a
    parameter keeps a gradient of its own, copied in after backward)."""

    def __init__(self, step: ExactStep, world: int, sharded: bool) -> None:
        self.world, self.sharded = world, sharded
        self.control = ControlSlots(step.micro, step.nb, step.norms.numel, world, step.device)
        self.plan = plan_buckets(step.nb * fx.BUCKET, self.control.grads, self.control.buf.element_size(), fx.BUCKET)
        samples = step.spec.global_batch
        self.path: WireSums | ShardSums = (
            ShardSums(step.row, self.control, self.plan, world, step.lo, step.bits, samples) if sharded
            else WireSums(step.row, step.wide, self.control, self.plan, step.lo, step.bits, samples))
        self.overlap = None if step.grads.loose else Overlap(step.params, step.grads.offsets, self.plan,
                                                             self.control.grads, self.path.launch)

    def begin(self, p: Pass) -> None:
        """A pass starts: the hooks disarmed (a step that failed half-way may have left them armed),
        the control slots zeroed, the path ready."""
        if self.overlap is not None:
            self.overlap.disarm()
        self.control.buf.zero_()
        self.path.begin(p)

    def arm(self) -> None:
        """The next backward is the pass's last on this rank: launch buckets as it fills them."""
        if self.overlap is not None:
            self.overlap.arm()

    def end(self, p: Pass) -> None:
        """Every micro-batch ran: launch the buckets not launched yet (every bucket, in a pass that is
        not overlapped: the same collectives, in the same order, as an overlapped pass), then whatever
        the path sums after them."""
        if p.overlap:
            assert self.overlap is not None
            if not p.count:
                self.overlap.arm()
            self.overlap.finish()
        else:
            for k, bucket in enumerate(self.plan):
                self.path.launch(k, bucket)
        self.path.end()

    def close(self) -> None:
        """Remove the gradient hooks."""
        if self.overlap is not None:
            self.overlap.close()
            self.overlap = None
