"""Bitwise-exact steps (``training.reduction: exact``, the default): a step's result is a function of
the training state and the step alone, whatever the world size, whichever rank runs which
micro-batch, in whatever order the collective sums, and again when a failed step is redone.

Step semantics. The step's global batch (the sampler's seeded indices) is a fixed sequence of
M = global_batch / micro_batch equal micro-batches; rank r of w runs the whole micro-batches
``shard_bounds(M, r, w)``. Each micro-batch runs alone: gradients cleared, torch's generators (CPU
and the current CUDA device) seeded from (seed, step, micro-batch) and restored afterwards,
BatchNorm and InstanceNorm running statistics reset to the step's start values.

Reduction (fixedpoint.py). The micro-batches' gradients are summed as exact fixed-point integers
held in float64, with per-bucket exponents the group agreed in the previous step's allreduce
(every rank's measured exponents ride in it as slots). A step where every rank runs at most one
micro-batch is summed by the owners of the buckets' shards from the raw float32 gradients
(exact_shards.py: the fast path's bytes, the same integers, so the same bits); otherwise a step
costs one allreduce, like the fast path, of twice the bytes: the overlap buckets (overlap.py), each converted and started as the last
micro-batch's backward fills it, the control slots in the bucket launched last. Every pass of
every rank issues the same bucket collectives in the same order, whether it overlaps, quantizes
or only measures. When a gradient outgrew its exponent, when the exponents are not known yet (the
first step) or when two ranks' exponents differ, every rank sees it in the same allreduce,
recomputes its micro-batches (a deterministic replay) and sums again with the exponents just
measured. A NaN or an Inf raises NonFiniteGradient on every rank at the same step (with a
GradScaler the step is skipped instead, as AMP expects).

Memory. The float32 gradients live in one row (each ``.grad`` a view of it, as the fast path's
buffer). A rank that runs one micro-batch a step (or none) converts each bucket into a float64
wire buffer of a bucket's size taken from a pool of WIRE_SLOTS, and turns each sum back into the
mean gradient as soon as it returns, which frees its buffer for the next bucket (during backward,
when more buckets than buffers are in flight); a rank with several micro-batches sums them in one
float64 buffer of the model's size, which its buckets then reduce. The conversion passes work a
chunk of buckets at a time (fixedpoint.chunk_rows) with no copy of the model beyond these. A
sharded step holds a pool of bucket-sized float32 slots beside the row (exact_shards.py).

Buffers. Running statistics of norm layers are combined: each micro-batch's forward updates them
from the step's start values, and the step's new statistics are the mean of the M updated values
(summed in micro-batch order in float64 from per-micro-batch slots of the allreduce): the update of
one pass with the micro-batches' mean statistics, ``num_batches_tracked`` advancing by one per step.
Any other buffer that forward changes is refused at build (a probe forward finds it).

Kernels. configure_process turns on torch.use_deterministic_algorithms and fixes the thread count;
micro-batch gradients are then bit-identical on boxes of one kind (same CPU model, torch build and
thread count). Across CPU models ATen, MKL and oneDNN pick code paths by instruction set, so mixed
fleets must pin them alike (ATEN_CPU_CAPABILITY, MKL_CBWR, ONEDNN_MAX_CPU_ISA), which is assumed,
not checked. On CUDA, deterministic algorithms need CUBLAS_WORKSPACE_CONFIG, set here if absent.
"""

from __future__ import annotations

import os
import zlib
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dpeer.trainer import fixedpoint as fx
from dpeer.trainer.allreduce import StepReduction
from dpeer.trainer.exact_shards import ShardedSum
from dpeer.trainer.overlap import Bucket, GradViews, Overlap, plan_buckets, wait_all
from dpeer.trainer.sampler import GlobalBatchSampler, micro_batch_seed, micro_batch_slice, shard_bounds
from dpeer.trainer.seeding import restore_rng, seed_rng, seeded
from dpeer.trainer.state import tensor_bytes
from dpeer.trainer.stepping import Trained

if TYPE_CHECKING:
    from dpeer.trainer.job_api import TrainSpec

_NORMS = torch.nn.modules.batchnorm._NormBase


WIRE_SLOTS = 8  # bucket-sized float64 wire buffers a rank with one micro-batch keeps (32 MiB of BUCKET_BYTES)


class ExactModeError(ValueError):
    """The job cannot train with exact reduction; the text says why and what to do instead."""


class NonFiniteGradient(ArithmeticError):
    """A micro-batch's gradient holds a NaN or an Inf; raised on every rank at the same step."""


def configure_process(threads: int = 0) -> None:
    """Kernel-side determinism for exact mode: deterministic algorithms, no cuDNN autotuning, the
    cuBLAS workspace that deterministic CUDA matmuls need, and ``threads`` intra-op threads (0 keeps
    torch's default, the box's core count, equal on boxes of one kind)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    if threads > 0:
        torch.set_num_threads(threads)


def check_spec(spec: TrainSpec) -> int:
    """The number of micro-batches per step, or ExactModeError for a job exact mode cannot run."""
    if spec.global_batch % spec.micro_batch:
        raise ExactModeError(
            f"exact reduction needs global_batch ({spec.global_batch}) to be a multiple of micro_batch "
            f"({spec.micro_batch}): a step is a fixed sequence of equal micro-batches")
    count = spec.global_batch // spec.micro_batch
    if count > fx.MAX_MICRO_BATCHES:
        raise ExactModeError(f"exact reduction sums at most {fx.MAX_MICRO_BATCHES} micro-batches per step, "
                             f"got {count}: raise micro_batch")
    for name, module in spec.model.named_modules():
        if isinstance(module, torch.nn.SyncBatchNorm):
            raise ExactModeError(f"module {name!r} is a SyncBatchNorm, whose forward synchronises ranks; exact "
                                 f"reduction runs each micro-batch alone and combines BatchNorm statistics itself: "
                                 f"use BatchNorm")
    return count


class NormBuffers:
    """The running statistics of the model's norm layers, combined exactly over a step's micro-batches."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.buffers = [b for m in model.modules() if isinstance(m, _NORMS) and m.track_running_stats
                        for b in m.buffers(recurse=False)]
        self.numel = sum(b.numel() for b in self.buffers)
        self._start: list[torch.Tensor] = []

    def snapshot(self) -> None:
        """Remember the step's start values."""
        self._start = [b.detach().clone() for b in self.buffers]

    def restore(self) -> None:
        """Put the step's start values back (before each micro-batch)."""
        for b, s in zip(self.buffers, self._start):
            b.copy_(s)

    def write(self, slot: torch.Tensor) -> None:
        """Copy the values one micro-batch's forward left into its float64 slot (-0.0 made +0.0, as the
        collective's x + 0 would)."""
        off = 0
        for b in self.buffers:
            slot[off : off + b.numel()].copy_(b.reshape(-1))
            off += b.numel()
        slot.add_(0.0)

    def combine(self, slots: torch.Tensor) -> None:
        """Set every buffer to the mean of its M slots ([M, numel], summed in micro-batch order)."""
        if not self.buffers:
            return
        total = slots[0].clone()
        for j in range(1, slots.shape[0]):
            total += slots[j]
        mean = total / slots.shape[0]
        off = 0
        for b in self.buffers:
            seg = mean[off : off + b.numel()].view(b.shape)
            off += b.numel()
            if not b.is_floating_point():
                if not torch.equal(seg, seg.round()):
                    raise ExactModeError("an integer norm-layer buffer changed differently in different micro-batches")
                seg = seg.round()
            b.copy_(seg)


def refuse_changing_buffers(spec: TrainSpec, norms: NormBuffers, sampler: GlobalBatchSampler,
                            collate: Any, device: torch.device) -> None:
    """A probe forward of step 0's first micro-batch (no gradients, generators and norm statistics
    put back): any buffer other than norm statistics that it changes is refused with ExactModeError."""
    others = {name: b for name, b in spec.model.named_buffers() if not any(b is n for n in norms.buffers)}
    if not others:
        return
    before = {name: (id(b), b._version) for name, b in others.items()}
    x, _ = collate([spec.dataset[i] for i in micro_batch_slice(sampler.indices_for_step(0), spec.micro_batch, 0)])
    norms.snapshot()
    with torch.no_grad(), seeded(0, device):
        spec.model(x.to(device))
    norms.restore()
    after = dict(spec.model.named_buffers())
    changed = sorted(n for n in before if n not in after or (id(after[n]), after[n]._version) != before[n])
    if changed:
        raise ExactModeError(
            f"the model's forward changes buffer(s) {', '.join(changed)}, which exact reduction cannot combine "
            f"over micro-batches (it combines BatchNorm and InstanceNorm running statistics only): "
            f"use training.reduction: fast, or keep that state out of buffers")


class ExactStep:
    """Exact reduction: whole micro-batches per rank, each with its own random stream, gradients
    summed in fixed point (see the module docstring)."""

    def __init__(self, spec: TrainSpec, params: list[torch.Tensor], sampler: GlobalBatchSampler,
                 device: torch.device, collate: Any = None) -> None:
        """``collate``: a TrainSpec job's, for the build's probe forward; a script job's forward is its
        own code, so its changing buffers are found after its first micro-batches instead."""
        self.micro = check_spec(spec)
        self.spec, self.params, self.sampler, self.device = spec, params, sampler, device
        self.bits = fx.fraction_bits(self.micro)
        self.numel = sum(p.numel() for p in params)
        self.nb = max(1, -(-self.numel // fx.BUCKET))
        self.dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
        self.lo, self.hi = fx.exponent_range(self.bits, self.dtype)
        home = params[0].device if params else device
        self.row = torch.zeros(self.nb, fx.BUCKET, dtype=self.dtype, device=home)
        same = self.dtype == torch.float64 and home == device
        chunk = min(self.nb, fx.chunk_rows(self.dtype))  # the float64 staging of one chunk of integers
        self.wide = None if same else torch.empty(chunk, fx.BUCKET, dtype=torch.float64, device=device)
        self._grads = GradViews(params, self.row.view(-1))
        self._scale: torch.Tensor | None = None
        self._amaxes = torch.zeros(1, self.nb, dtype=self.dtype, device=home)
        self.norms = NormBuffers(spec.model)
        if collate is not None:
            refuse_changing_buffers(spec, self.norms, sampler, collate, device)
        self._others = [b for b in spec.model.buffers() if not any(b is n for n in self.norms.buffers)]
        self._versions: list[int] = []
        self.exponents: torch.Tensor | None = None  # this step's E per bucket, agreed by the group
        self._print = -1  # crc32 of the exponents (-1: none), compared across ranks in the allreduce
        self._step = 0
        self.redos = 0  # steps whose sum was redone (first step, grown gradients, differing exponents)
        self._ctl = torch.empty(0, dtype=torch.float64, device=device)  # this rank's control slots
        self._acc: torch.Tensor | None = None  # [control | grads] sums of a rank with several micro-batches
        self._slots: list[torch.Tensor] = []  # free bucket-sized wire buffers of a rank with one micro-batch
        self._plan: list[Bucket] = []
        self._o: dict[str, int] = {}
        self._world = 0
        self._mine: list[int] = []
        self._keys: list[tuple[int, list[int]]] = []
        self._n = 0
        self._rng: tuple[torch.Tensor, torch.Tensor | None] | None = None  # generator states a micro-batch's seeding saved
        self._redo: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, list[int]] | None = None
        self._pass_of: tuple[torch.Tensor | None, torch.Tensor | None, bool, torch.Tensor] = (None, None, False, self._amaxes)
        self._newest = -1  # the newest generation this rank has seen, sent with the step
        self._rank, self._world_planned = 0, 1
        self._overlap: Overlap | None = None
        self._sharded = False  # this step's sums go through owners' shards (exact_shards.py)
        self._shards: ShardedSum | None = None
        self._ctl_work: Any = None  # a sharded pass's allreduce of the control slots
        self._works: list[tuple[Any, Bucket, torch.Tensor, torch.Tensor | None]] = []  # work, bucket, wire, slot
        self._tail: torch.Tensor | None = None  # the reduced control slots, on the CPU
        self._pending: tuple[torch.Tensor | None, torch.Tensor, int, int, bool] | None = None
        # (scale, amax, last i, rank, whether launching converts the last micro-batch's buckets)

    # -- the allreduce buffer: [M losses | per rank: nb exponents, fingerprint, flag, newest | M*norms | grads]
    def _layout(self, world: int) -> dict[str, int]:
        offs = {"loss": 0, "ranks": self.micro}
        offs["norm"] = offs["ranks"] + world * (self.nb + 3)
        offs["grads"] = offs["norm"] + self.micro * self.norms.numel
        offs["end"] = offs["grads"] + self.nb * fx.BUCKET
        return offs

    def _buffer(self, world: int) -> torch.Tensor:
        """The control slots of a group of ``world``, its buckets planned. The gradients' sums travel
        in the planned buckets: a rank with several micro-batches sums them in one float64 buffer of
        the whole model's (``_acc``, the buckets its slices); a rank with one micro-batch (or none)
        converts each bucket into a wire buffer of a bucket's size from a pool of WIRE_SLOTS, which
        returns to the pool once its sum is back and turned into the mean gradient."""
        if world != self._world:
            self.close()
            o = self._o = self._layout(world)
            self._ctl = torch.zeros(o["grads"], dtype=torch.float64, device=self.device)
            self._acc, self._slots, self._works, self._shards = None, [], [], None
            self._plan = plan_buckets(self.nb * fx.BUCKET, o["grads"], self._ctl.element_size(), fx.BUCKET)
            if not self._grads.loose:  # a gradient of its own is copied in after backward, never overlapped
                self._overlap = Overlap(self.params, self._grads.offsets, self._plan, o["grads"], self._launch)
            self._world = world
        return self._ctl

    def close(self) -> None:
        """Remove the gradient hooks."""
        if self._overlap is not None:
            self._overlap.close()
            self._overlap = None
        self._world = 0

    def _set_exponents(self, exponents: torch.Tensor | None) -> None:
        """Agree on the next step's exponents; their fingerprint and scales are kept with them."""
        self.exponents = exponents
        self._print = -1 if exponents is None else zlib.crc32(tensor_bytes(exponents))
        self._scale = None if exponents is None else fx.scales(exponents, self.bits, self.dtype, self.row.device)

    def keys(self, step: int, rank: int, world: int) -> list[tuple[int, list[int]]]:
        """This rank's micro-batches of ``step`` in order, each ``(j, dataset indices)``: the whole
        micro-batches ``shard_bounds(M, rank, world)`` of the step's fixed sequence."""
        first, end = shard_bounds(self.micro, rank, world)
        indices, mb = self.sampler.indices_for_step(step), self.spec.micro_batch
        return [(j, micro_batch_slice(indices, mb, j)) for j in range(first, end)]

    def plan(self, step: int, rank: int, world: int) -> Trained:
        """What this rank trains of ``step`` (recorded before any of its sums can leave)."""
        self._keys = self.keys(step, rank, world)
        self._mine = [j for j, _ in self._keys]
        self._sharded = 1 < world and self.micro <= world and self.dtype == torch.float32
        self._step, self._rank, self._world_planned = step, rank, world
        return Trained(step, self._mine, [i for _, mb in self._keys for i in mb])

    def planned(self) -> list[tuple[int, list[int]]]:
        """The planned micro-batches, ``(j, dataset indices)``, in the order they run."""
        return self._keys

    def begin(self, newest_seen: int = -1) -> None:
        """Start the planned step's first pass with the agreed exponents, the last micro-batch's
        buckets summed into the step's allreduce as its backward fills them."""
        self._newest, self._redo = newest_seen, None
        self.norms.snapshot()
        self._versions = [b._version for b in self._others]
        self._begin_pass(self.exponents, self._scale, overlap=self._scale is not None)

    def _amax(self, count: int) -> torch.Tensor:
        """A [max(count, 1), buckets] scratch for the micro-batches' largest magnitudes (zeros)."""
        if self._amaxes.shape[0] < max(count, 1):
            self._amaxes = torch.zeros(max(count, 1), self.nb, dtype=self.dtype, device=self.row.device)
        out = self._amaxes[: max(count, 1)]
        return out.zero_() if count == 0 else out

    def _begin_pass(self, exponents: torch.Tensor | None, scale: torch.Tensor | None, overlap: bool) -> None:
        """A pass over the micro-batches quantizes with ``scale`` (None: only measures); ``overlap``:
        the last micro-batch's buckets start their allreduce as its backward fills them."""
        ctl = self._buffer(self._world_planned)
        if self._overlap is not None:
            self._overlap.disarm()  # a step that failed half-way may have left it armed
        overlap = (overlap or self._sharded) and (scale is not None or self._sharded) and self._overlap is not None
        ctl.zero_()
        if len(self._mine) > 1 and self._acc is None:
            self._acc = torch.zeros(self._o["end"], dtype=torch.float64, device=self.device)
        amax = self._amax(len(self._mine))
        self._grads.bind()
        if self._works:  # a step that failed half-way: its buffers may still be written, take fresh ones
            self._works, self._slots = [], []
        self._tail, self._ctl_work = None, None
        self._pass_of = (exponents, scale, overlap, amax)
        self._pending = (scale, amax, len(self._mine) - 1, self._rank, True) if overlap else None
        if self._sharded:
            self._begin_shards()

    def _begin_shards(self) -> None:
        """A sharded pass: this group's exchanges (fresh ones after a step that failed half-way), and
        a zero gradient for a rank with no micro-batch."""
        if self._shards is None or self._shards.rank != self._rank or self._shards.busy:
            g = self._o["grads"]
            spans = [(max(b.lo - g, 0) // fx.BUCKET, (b.hi - g) // fx.BUCKET) for b in self._plan]
            self._shards = ShardedSum(self.row, spans, self._rank, self._world_planned, self.lo, self.bits,
                                      self.spec.global_batch)
        first = self._o["ranks"]  # rank 0's measured slots carry every row's, each written by its owner
        self._shards.begin(self._pass_of[0], self._ctl[first : first + self.nb])
        if not self._mine:
            self.row.zero_()

    def enter(self, n: int) -> None:
        """Micro-batch ``n`` of the plan runs alone: the row zeroed (and a loose parameter's gradient
        dropped), norm statistics at the step's start values, torch's generators seeded from (seed,
        step, j) until ``leave``."""
        self.row.zero_()
        self._grads.drop_loose()
        self.norms.restore()
        self._n = n
        self._rng = seed_rng(micro_batch_seed(self.spec.seed, self._step, self._mine[n]), self.device)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the micro-batch's summed loss. Each ``.grad`` is a view of the zeroed row (as
        DDP's gradient_as_bucket_view), so backward accumulates into it in place: 0 + g is g (and
        -0.0 becomes +0.0), with no fresh allocation; the loss and the norm statistics go to their
        slots first (an armed backward may send them)."""
        ctl, o, j = self._ctl, self._o, self._mine[self._n]
        ctl[o["loss"] + j] = float(loss.detach()) + 0.0
        if self.norms.buffers:
            self.norms.write(ctl[o["norm"] : o["grads"]].view(self.micro, self.norms.numel)[j])
        if self._pending is not None and self._n == len(self._mine) - 1 and self._overlap is not None:
            self._overlap.arm()
        (self.spec.scaler.scale(loss) if self.spec.scaler is not None else loss).backward()

    def leave(self, n: int) -> None:
        """Micro-batch ``n`` is done: generators put back, its gradient measured and quantized into the
        sum (the last one's as its buckets launch, when the pass overlaps or it is the rank's only
        one). A grad that is not the row's view (another dtype, or replaced by the job) is copied in."""
        self.abort()
        self._grads.gather_loose()
        _exponents, scale, overlap, amax = self._pass_of
        if n == len(self._mine) - 1 and (overlap or n == 0):
            return  # measured and converted bucket by bucket as it launches
        acc = None
        if scale is not None and self._acc is not None:
            acc = self._acc[self._o["grads"] :].view(self.nb, fx.BUCKET)
        fx.quantize(self.row, scale, amax[n], acc, self.wide, first=n == 0)

    def abort(self) -> None:
        """Put torch's generators back if a micro-batch left them seeded (it ended, or failed), and
        the norm statistics at the step's start values: a failed step is redone from them (its
        forward's updates are in the slots once its backward ran; the first attempt's would
        otherwise become the redo's start values at ``begin``)."""
        if self._rng is not None:
            restore_rng(self._rng, self.device)
            self._rng = None
            self.norms.restore()

    def end_pass(self) -> None:
        """Every micro-batch ran: launch the buckets not launched yet (every bucket, in a pass that is not
        overlapped); norm statistics back at the step's start values until combine."""
        _exponents, scale, overlap, amax = self._pass_of
        if overlap:
            assert self._overlap is not None
            if not self._mine:
                self._overlap.arm()
            self._overlap.finish()
        elif self._sharded:
            for k, bucket in enumerate(self._plan):
                self._launch(k, bucket)
        else:  # the same collectives, in the same order, as an overlapped pass (another rank's may be)
            self._pending = (scale, amax, len(self._mine) - 1, self._rank, len(self._mine) <= 1)
            for k, bucket in enumerate(self._plan):
                self._launch(k, bucket)
        if self._sharded:
            self._sum_shards()
        self.norms.restore()
        if [b._version for b in self._others] != self._versions:
            names = [n for n, b in self.spec.model.named_buffers() if any(b is x for x in self._others)]
            raise ExactModeError(
                f"the model's forward changed buffer(s) among {', '.join(names)}, which exact reduction cannot "
                f"combine over micro-batches (it combines BatchNorm and InstanceNorm running statistics only): "
                f"use training.reduction: fast, or keep that state out of buffers")

    def _launch(self, _k: int, bucket: Bucket) -> None:
        """Start one bucket's allreduce; when ``convert``, its slice of the last micro-batch's gradient is
        first measured and quantized into the sum (into a pooled wire buffer on a rank with one
        micro-batch or none). The bucket at the front carries the control slots, written once every
        other bucket's largest magnitudes are known."""
        if self._sharded:
            assert self._shards is not None
            self._shards.launch(_k)
            return
        assert self._pending is not None
        scale, amax, last, rank, convert = self._pending
        g = self._o["grads"]
        r0, r1 = max(bucket.lo - g, 0) // fx.BUCKET, (bucket.hi - g) // fx.BUCKET
        slot = self._slot() if self._acc is None or len(self._mine) <= 1 else None
        wire = self._acc[bucket.lo : bucket.hi] if slot is None else slot[: bucket.hi - bucket.lo]
        grads = wire[max(g - bucket.lo, 0) :].view(r1 - r0, fx.BUCKET)
        if convert and last >= 0 and r1 > r0:
            fx.quantize(self.row[r0:r1], None if scale is None else scale[r0:r1], amax[last, r0:r1],
                        grads, self.wide, first=last == 0)
        elif convert and r1 > r0 and scale is not None:
            grads.zero_()  # a rank with no micro-batch adds zeros
        if bucket.lo == 0:
            self._write_control(self._pass_of[0], amax, rank)
            wire[:g].copy_(self._ctl)
        self._works.append((dist.all_reduce(wire, async_op=True), bucket, wire, slot))

    def _slot(self) -> torch.Tensor:
        """A free wire buffer of the longest bucket's size: a new one while fewer than WIRE_SLOTS are
        in use, else the oldest bucket in flight's, once its sum is back and finished."""
        while not self._slots:
            if sum(slot is not None for *_, slot in self._works) < WIRE_SLOTS:
                longest = max(b.hi - b.lo for b in self._plan)
                self._slots.append(torch.zeros(longest, dtype=torch.float64, device=self.device))
            else:
                self._complete_oldest()
        return self._slots.pop()

    def _complete_oldest(self) -> None:
        """Wait for the oldest bucket in flight; its sum (when the pass quantized) into the mean
        gradient of its rows, at once: a later redo recomputes every row, so nothing is lost if the
        step's exponents turn out not to fit. The front bucket's control slots are kept."""
        work, bucket, wire, slot = self._works.pop(0)
        wait_all([work])
        g = self._o["grads"]
        if bucket.lo == 0:
            self._tail = wire[:g].to("cpu", copy=True)
        exponents, scale = self._pass_of[0], self._pass_of[1]
        r0, r1 = max(bucket.lo - g, 0) // fx.BUCKET, (bucket.hi - g) // fx.BUCKET
        if scale is not None and exponents is not None and r1 > r0:
            grads = wire[max(g - bucket.lo, 0) :].view(r1 - r0, fx.BUCKET)
            fx.finish(grads, exponents[r0:r1], self.bits, self.spec.global_batch, self.row[r0:r1])
        if slot is not None:
            self._slots.append(slot)

    def _write_control(self, exponents: torch.Tensor | None, amax: torch.Tensor, rank: int) -> None:
        """This rank's slots: its measured exponents, the exponents' fingerprint, whether a gradient
        outgrew its exponent, and the newest generation it has seen."""
        buf, o = self._ctl, self._o
        measured = fx.bucket_exponents(amax.amax(dim=0), self.lo)
        grew = exponents is None or bool((measured > exponents.to(measured.device)).any())
        block = o["ranks"] + rank * (self.nb + 3)
        buf[block : block + self.nb] = measured.to(self.device)
        buf[block + self.nb : block + self.nb + 3] = torch.tensor([float(self._print), float(grew), float(self._newest)],
                                                                  dtype=torch.float64)

    def reduce(self, rank: int, world: int) -> StepReduction | None:
        """The step's allreduce completes (it commits the step), then the mean gradient in every
        ``.grad`` and the combined norm statistics in their buffers. None when the exponents did not
        fit: the micro-batches run again (a second pass that quantizes with the measured exponents,
        begun here), and the next ``end_pass`` and ``reduce`` sum them."""
        self._buffer(world)
        if self._sharded:
            return self._reduce_shards(world)
        o = self._o
        while self._works:
            self._complete_oldest()
        if self._redo is not None:
            redo, self._redo = self._redo, None
            return self._finish(*redo)
        assert self._tail is not None, "reduce() before end_pass()"
        tail, self._tail = self._tail, None
        ranks, prints, seen, loss_mean = self._read_tail(tail, world)
        measured = ranks[:, : self.nb].to(torch.int64).amax(dim=0)
        if bool((measured >= fx.NONFINITE).any()):
            return self._nonfinite(measured, loss_mean, seen)
        used = self.exponents
        if used is None or float(ranks[:, self.nb + 1].sum()) > 0 or len(prints) > 1 or -1.0 in prints:
            return self._run_again(measured, tail, loss_mean, seen)
        return self._finish(used, measured, tail, loss_mean, seen)

    def _run_again(self, measured: torch.Tensor, tail: torch.Tensor, loss_mean: float, seen: list[int]) -> None:
        """The exponents did not fit: a second pass over the micro-batches, quantized with the measured
        ones, begun; the next ``reduce`` finishes with this pass's control slots."""
        used = measured.clamp(min=self.lo, max=self.hi)
        self.redos += 1
        self._redo = (used, measured, tail, loss_mean, seen)
        self._begin_pass(used, fx.scales(used, self.bits, self.dtype, self.row.device), overlap=False)

    def _read_tail(self, tail: torch.Tensor, world: int) -> tuple[torch.Tensor, set[float], list[int], float]:
        """The reduced control slots: every rank's block, the exponents' fingerprints, the newest
        generations seen, the step's mean loss."""
        o = self._o
        ranks = tail[o["ranks"] : o["norm"]].view(world, self.nb + 3)
        seen = [int(v) for v in ranks[:, self.nb + 2].tolist()]
        return ranks, set(ranks[:, self.nb].tolist()), seen, sum(tail[: self.micro].tolist()) / self.spec.global_batch

    def _sum_shards(self) -> None:
        """A sharded pass's collectives after its first exchanges: the owners' remaining sums, then the
        control slots (this rank's fingerprint and newest generation, the owners' measured exponents,
        losses and norm statistics) summed."""
        assert self._shards is not None
        block = self._o["ranks"] + self._rank * (self.nb + 3)
        self._ctl[block + self.nb] = float(self._print)
        self._ctl[block + self.nb + 2] = float(self._newest)
        self._shards.finish()
        self._ctl_work = dist.all_reduce(self._ctl, async_op=True)

    def _reduce_shards(self, world: int) -> StepReduction | None:
        """A sharded step's reduction: the owners' means and measured exponents back; when the
        exponents did not fit (or ranks disagree on them), None and a second pass begun, as on the
        allreduce path (the owners keep no contributions: exact_shards.py)."""
        assert self._shards is not None and self._ctl_work is not None, "reduce() before end_pass()"
        work, self._ctl_work = self._ctl_work, None
        wait_all([work])
        self._shards.collect()
        if self._redo is not None:
            redo, self._redo = self._redo, None
            return self._finish(*redo)
        tail = self._ctl.to("cpu", copy=True)
        ranks, prints, seen, loss_mean = self._read_tail(tail, world)
        measured = ranks[0, : self.nb].to(torch.int64)
        if bool((measured >= fx.NONFINITE).any()):
            return self._nonfinite(measured, loss_mean, seen)
        used = self._pass_of[0]
        if used is None or bool((measured > used).any()) or len(prints) > 1 or -1.0 in prints:
            return self._run_again(measured, tail, loss_mean, seen)
        return self._finish(used, measured, tail, loss_mean, seen)

    def _finish(self, used: torch.Tensor, measured: torch.Tensor, tail: torch.Tensor, loss_mean: float,
                seen: list[int]) -> StepReduction:
        """The norm statistics combined, each parameter without a view given its slice of the mean
        gradient (the row got it bucket by bucket as the sums came back), the next exponents."""
        o = self._o
        self.norms.combine(tail[o["norm"] : o["grads"]].view(self.micro, self.norms.numel))
        self._grads.bind()
        self._grads.scatter_loose()
        self._set_exponents(fx.next_exponents(measured, used, self.lo, self.hi))
        return StepReduction(loss_mean, seen)

    def _nonfinite(self, measured: torch.Tensor, loss_mean: float, seen: list[int]) -> StepReduction:
        """A NaN or Inf gradient somewhere in the group: skip the step under a GradScaler (every grad
        NaN, so scaler.step skips and backs off), else raise on every rank alike."""
        bucket = int((measured >= fx.NONFINITE).nonzero()[0])
        if self.spec.scaler is None:
            raise NonFiniteGradient(
                f"step {self._step}: the gradient of parameter {self._param_at(bucket * fx.BUCKET)} "
                f"(or another in its {fx.BUCKET}-element bucket) is NaN or Inf; exact reduction refuses to sum it")
        for p in self.params:
            p.grad = torch.full_like(p, float("nan"))
        self._set_exponents(None)
        return StepReduction(loss_mean, seen)

    def _param_at(self, offset: int) -> str:
        names = {id(p): n for n, p in self.spec.model.named_parameters()}
        off = 0
        for p in self.params:
            if off + p.numel() > offset:
                return names.get(id(p), "?")
            off += p.numel()
        return "?"

    def state(self) -> dict[str, Any]:
        """The agreed exponents of the next step: part of the training state, so a healed or resumed
        replica sums the way its peers and a fault-free run do."""
        return {"exponents": None if self.exponents is None else self.exponents.tolist()}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Take the exponents of a captured state (None: unknown, the next step measures them)."""
        values = (state or {}).get("exponents")
        self._set_exponents(None if values is None else torch.tensor(values, dtype=torch.int64))
