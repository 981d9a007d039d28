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
wire buffer of a bucket's size taken from a pool of WIRE_SLOTS (exact_sums.py), and turns each sum
back into the mean gradient as soon as it returns, which frees its buffer for the next bucket
(during backward, when more buckets than buffers are in flight); a rank with several micro-batches
sums them in one float64 buffer of the model's size, which its buckets then reduce. The conversion
passes work a chunk of buckets at a time (fixedpoint.chunk_rows) with no copy of the model beyond
these. A sharded step holds a pool of bucket-sized float32 slots beside the row (exact_shards.py).

Buffers. Running statistics of norm layers are combined: each micro-batch's forward updates them
from the step's start values, and the step's new statistics are the mean of the M updated values
(summed in micro-batch order in float64 from per-micro-batch slots of the allreduce): the update of
one pass with the micro-batches' mean statistics, ``num_batches_tracked`` advancing by one per step.
Any other buffer that forward changes is refused at build (a probe forward finds it).

Kernels. configure_process turns on torch.use_deterministic_algorithms and fixes the thread count;
micro-batch gradients are then bit-identical on boxes of one kind (same CPU model, torch build and
thread count). Across CPU models ATen, MKL and oneDNN pick code paths by instruction set, so mixed
fleets must pin them alike (ATEN_CPU_CAPABILITY, MKL_CBWR, ONEDNN_MAX_CPU_ISA), which is assumed,
not checked. On CUDA, deterministic algorithms need CUBLAS_WORKSPACE_CONFIG, which
configure_process sets if absent.

Parts. ExactStep (here) plans the step, drives its passes and decides what a reduced step means;
exact_rules.py holds what exact mode asks of the process and the job (configure_process,
check_spec, the errors), exact_buffers.py the micro-batches' isolation and the norm statistics,
exact_control.py the agreed exponents and the control slots, exact_sums.py the paths of the sums.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from dpeer.trainer import fixedpoint as fx
from dpeer.trainer.allreduce import StepReduction
from dpeer.trainer.exact_buffers import Isolation, NormBuffers, refuse_changing_buffers
from dpeer.trainer.exact_control import Exponents, Pass
from dpeer.trainer.exact_rules import ExactModeError, NonFiniteGradient, check_spec, configure_process
from dpeer.trainer.exact_sums import GroupSums
from dpeer.trainer.overlap import GradViews
from dpeer.trainer.sampler import GlobalBatchSampler, micro_batch_seed, micro_batch_slice, shard_bounds, share_counts
from dpeer.trainer.stepping import Trained

if TYPE_CHECKING:
    from dpeer.trainer.job_api import TrainSpec

__all__ = ["ExactModeError", "ExactStep", "NonFiniteGradient", "configure_process"]


class ExactStep:
    """Exact reduction: whole micro-batches per rank, each with its own random stream, gradients
    summed in fixed point (see the module docstring).

    It holds what every part reads (the spec, the parameters and their gradient row, the step's
    plan and its current pass) and wires the parts: ``agreed`` (the exponents the group agreed,
    exact_control.py), ``isolation`` (each micro-batch alone: generators, norm statistics, other
    buffers; exact_buffers.py) and the sums of the current group size (exact_sums.GroupSums: the
    control slots, the buckets and their hooks, the allreduce or the owners' path). It decides what a
    reduced step means: the mean gradient, a redo, or a non-finite gradient."""

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
        self.grads = GradViews(params, self.row.view(-1))
        self.agreed = Exponents(self.bits, self.dtype, home, self.lo, self.hi)
        self._amaxes = torch.zeros(1, self.nb, dtype=self.dtype, device=home)
        self.norms = NormBuffers(spec.model)
        if collate is not None:
            refuse_changing_buffers(spec, self.norms, sampler, collate, device)
        self.isolation = Isolation(spec, self.norms, device)
        self.redos = 0  # steps whose sum was redone (first step, grown gradients, differing exponents)
        self._sums: GroupSums | None = None  # the current group size's
        self._keys: list[tuple[int, list[int]]] = []
        self._mine: list[int] = []
        self._step, self._rank, self._world_planned = 0, 0, 1
        self._sharded = False  # this step's sums go through owners' shards (exact_shards.py)
        self._n = 0
        self._newest = -1  # the newest generation this rank has seen, sent with the step
        self._pass = Pass(None, None, False, self._amaxes, 0, 0, -1, -1)
        self._redo: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, list[int]] | None = None

    def keys(self, step: int, rank: int, world: int, shares: Sequence[int] = ()) -> list[tuple[int, list[int]]]:
        """This rank's micro-batches of ``step`` in order, each ``(j, dataset indices)``: the whole
        micro-batches ``shard_bounds(M, rank, world, shares)`` of the step's fixed sequence."""
        first, end = shard_bounds(self.micro, rank, world, shares)
        indices, mb = self.sampler.indices_for_step(step), self.spec.micro_batch
        return [(j, micro_batch_slice(indices, mb, j)) for j in range(first, end)]

    def plan(self, step: int, rank: int, world: int, shares: Sequence[int] = ()) -> Trained:
        """What this rank trains of ``step`` (recorded before any of its sums can leave); the group
        sums by shard owners when no rank runs more than one micro-batch."""
        self._keys = self.keys(step, rank, world, shares)
        self._mine = [j for j, _ in self._keys]
        most = max(share_counts(self.micro, shares)) if shares else -(-self.micro // world)
        self._sharded = 1 < world and most <= 1 and self.dtype == torch.float32
        self._step, self._rank, self._world_planned = step, rank, world
        return Trained(step, self._mine, [i for _, mb in self._keys for i in mb])

    def planned(self) -> list[tuple[int, list[int]]]:
        """The planned micro-batches, ``(j, dataset indices)``, in the order they run."""
        return self._keys

    def begin(self, newest_seen: int = -1) -> None:
        """Start the planned step's first pass with the agreed exponents, the last micro-batch's
        buckets summed into the step's allreduce as its backward fills them."""
        self._newest, self._redo = newest_seen, None
        self.isolation.begin()
        self._begin_pass(self.agreed.values, self.agreed.scale, overlap=self.agreed.scale is not None)

    def _group(self, world: int) -> GroupSums:
        """The sums of a group of ``world``, made anew (its buckets planned, its hooks set) when the
        group's size or its path changed (a view's shares can move a group of one size between the
        owners' path and the allreduce)."""
        if self._sums is None or self._sums.world != world or self._sums.sharded != self._sharded:
            self.close()
            self._sums = GroupSums(self, world, self._sharded)
        return self._sums

    def _amax(self, count: int) -> torch.Tensor:
        """A [max(count, 1), buckets] scratch for the micro-batches' largest magnitudes (zeros)."""
        if self._amaxes.shape[0] < max(count, 1):
            self._amaxes = torch.zeros(max(count, 1), self.nb, dtype=self.dtype, device=self.row.device)
        out = self._amaxes[: max(count, 1)]
        return out.zero_() if count == 0 else out

    def _begin_pass(self, exponents: torch.Tensor | None, scale: torch.Tensor | None, overlap: bool) -> None:
        """A pass over the micro-batches quantizes with ``scale`` (None: only measures); ``overlap``:
        the last micro-batch's buckets start their sums as its backward fills them (always in a
        sharded pass, whose owners measure)."""
        sums = self._group(self._world_planned)
        overlap = (overlap or self._sharded) and (scale is not None or self._sharded) and sums.overlap is not None
        amax = self._amax(len(self._mine))
        self.grads.bind()
        self._pass = Pass(exponents, scale, overlap, amax, len(self._mine), self._rank, self.agreed.fingerprint,
                          self._newest)
        sums.begin(self._pass)

    def enter(self, n: int) -> None:
        """Micro-batch ``n`` of the plan runs alone: the row zeroed (and a loose parameter's gradient
        dropped), norm statistics at the step's start values, torch's generators seeded from (seed,
        step, j) until ``leave``."""
        self.row.zero_()
        self.grads.drop_loose()
        self._n = n
        self.isolation.enter(micro_batch_seed(self.spec.seed, self._step, self._mine[n]))

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the micro-batch's summed loss. Each ``.grad`` is a view of the zeroed row (as
        DDP's gradient_as_bucket_view), so backward accumulates into it in place: 0 + g is g (and
        -0.0 becomes +0.0), with no fresh allocation; the loss and the norm statistics go to their
        slots first (an armed backward may send them)."""
        assert self._sums is not None, "backward() before begin()"
        self._sums.control.write_sample(self._mine[self._n], loss, self.norms)
        if self._pass.overlap and self._n == len(self._mine) - 1:
            self._sums.arm()
        (self.spec.scaler.scale(loss) if self.spec.scaler is not None else loss).backward()

    def leave(self, n: int) -> None:
        """Micro-batch ``n`` is done: generators put back, its gradient measured and quantized into the
        sum (the last one's as its buckets launch, when the pass overlaps or it is the rank's only
        one). A grad that is not the row's view (another dtype, or replaced by the job) is copied in."""
        self.abort()
        self.grads.gather_loose()
        p = self._pass
        if n == len(self._mine) - 1 and (p.overlap or n == 0):
            return  # measured and converted bucket by bucket as it launches
        acc = None
        if p.scale is not None and self._sums is not None:
            acc = self._sums.path.grads_sum()
        fx.quantize(self.row, p.scale, p.amax[n], acc, self.wide, first=n == 0)

    def abort(self) -> None:
        """Put torch's generators back if a micro-batch left them seeded (it ended, or failed), and
        the norm statistics at the step's start values: a failed step is redone from them (its
        forward's updates are in the slots once its backward ran; the first attempt's would
        otherwise become the redo's start values at ``begin``)."""
        self.isolation.abort()

    def end_pass(self) -> None:
        """Every micro-batch ran: launch the buckets not launched yet (every bucket, in a pass that is not
        overlapped); norm statistics back at the step's start values until combine."""
        assert self._sums is not None, "end_pass() before begin()"
        self._sums.end(self._pass)
        self.isolation.end()

    def reduce(self, rank: int, world: int) -> StepReduction | None:
        """The step's sums complete (they commit the step), then the mean gradient in every ``.grad``
        and the combined norm statistics in their buffers. None when the exponents did not fit (or
        the ranks disagree on them): the micro-batches run again (a second pass that quantizes with
        the measured exponents, begun here), and the next ``end_pass`` and ``reduce`` sum them."""
        sums = self._group(world)
        sums.path.wait()
        if self._redo is not None:
            redo, self._redo = self._redo, None
            return self._finish(*redo)
        tail = sums.path.tail()
        ranks, prints, seen, loss_mean = sums.control.read(tail, world, self.spec.global_batch)
        measured = sums.path.measured(ranks)
        if bool((measured >= fx.NONFINITE).any()):
            return self._nonfinite(measured, loss_mean, seen)
        used = self._pass.exponents
        if used is None or sums.path.outgrew(ranks, measured, used) or len(prints) > 1 or -1.0 in prints:
            return self._run_again(measured, tail, loss_mean, seen)
        return self._finish(used, measured, tail, loss_mean, seen)

    def _run_again(self, measured: torch.Tensor, tail: torch.Tensor, loss_mean: float, seen: list[int]) -> None:
        """The exponents did not fit: a second pass over the micro-batches, quantized with the measured
        ones, begun; the next ``reduce`` finishes with this pass's control slots."""
        used, scale = self.agreed.fitting(measured)
        self.redos += 1
        self._redo = (used, measured, tail, loss_mean, seen)
        self._begin_pass(used, scale, overlap=False)

    def _finish(self, used: torch.Tensor, measured: torch.Tensor, tail: torch.Tensor, loss_mean: float,
                seen: list[int]) -> StepReduction:
        """The norm statistics combined, each parameter without a view given its slice of the mean
        gradient (the row got it bucket by bucket as the sums came back), the next exponents."""
        assert self._sums is not None
        self.norms.combine(self._sums.control.norm_slots(tail))
        self.grads.bind()
        self.grads.scatter_loose()
        self.agreed.advance(measured, used)
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
        self.agreed.set(None)
        return StepReduction(loss_mean, seen)

    def _param_at(self, offset: int) -> str:
        names = {id(p): n for n, p in self.spec.model.named_parameters()}
        off = 0
        for p in self.params:
            if off + p.numel() > offset:
                return names.get(id(p), "?")
            off += p.numel()
        return "?"

    def close(self) -> None:
        """Remove the gradient hooks."""
        if self._sums is not None:
            self._sums.close()
            self._sums = None

    def state(self) -> dict[str, Any]:
        """The agreed exponents of the next step: part of the training state, so a healed or resumed
        replica sums the way its peers and a fault-free run do."""
        return self.agreed.state()

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Take the exponents of a captured state (None: unknown, the next step measures them)."""
        self.agreed.load_state(state)
