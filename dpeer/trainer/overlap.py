"""The step's reduction overlapped with backward, bucket by bucket, as DDP does.

A step's gradients live in one flat buffer, ``[control | gradients]``, each parameter's ``.grad`` a
view of its slice (DDP's gradient_as_bucket_view; the exact mode keeps the float32 gradients in a
row of its own and reduces its fixed-point integers instead). The buffer is cut into buckets of
contiguous elements laid from the end, since backward produces the last parameters' gradients
first: the first bucket is small, so the first collective starts early, the others larger; the
bucket at the front also carries the control slots. During the step's final backward a hook after
each parameter's gradient is accumulated counts down the buckets it lies in; a bucket whose
parameters are all done is handed to ``launch`` (which converts it if it must and starts its
asynchronous allreduce). Buckets are launched strictly in order, whatever order hooks fire in,
so every rank issues the same collectives in the same sequence; whatever was not launched when
backward returns (a parameter that got no gradient, a rank with no micro-batch) is launched then.
A parameter counts once per backward even when its gradient is accumulated several times (one used
in several reentrant checkpoint segments, each running a backward of its own); one accumulated
again after its bucket left raises TwiceAccumulated, since what was sent lacks it (DDP refuses
the same: "mark a variable ready only once").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from dpeer.trainer.group import GroupError

FIRST_BUCKET_BYTES = 1 << 20
BUCKET_BYTES = 4 << 20


def wait_all(works: list[Any]) -> None:
    """Wait for a step's collectives. A failure is the group's (a peer died, hung or was cut) and is
    raised as a GroupError: Work.wait raises from C++ with no torch.distributed frame, which would
    otherwise read as the job's own error (decisions.classify_failure)."""
    try:
        for work in works:
            work.wait()
    except RuntimeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GroupError(f"the step's allreduce failed: {first}") from None


class TwiceAccumulated(RuntimeError):
    """A parameter's gradient was accumulated again after its bucket's collective started."""


@dataclass(frozen=True)
class Bucket:
    """Buffer elements [lo, hi) (the first bucket launched holds the row's end; the last, from 0,
    holds the control slots too)."""

    lo: int
    hi: int


def plan_buckets(grads: int, control: int, element_bytes: int, align: int = 1,
                 first_bytes: int = FIRST_BUCKET_BYTES, bucket_bytes: int = BUCKET_BYTES) -> list[Bucket]:
    """Buckets over a buffer of ``control`` slots then ``grads`` gradient elements, in launch order:
    from the end, the first of about ``first_bytes``, the others of about ``bucket_bytes``, every
    boundary inside the gradients a multiple of ``align`` gradient elements (the exact mode's
    fixed-point buckets must not straddle two)."""
    def elements(nbytes: int) -> int:
        return max(align, nbytes // element_bytes // align * align)

    buckets, hi, size = [], grads, elements(first_bytes)
    while hi > 0:
        lo = max(0, hi - size)
        if lo and lo % align:
            lo -= lo % align
        buckets.append(Bucket(control + lo if lo else 0, control + hi))
        hi, size = lo, elements(bucket_bytes)
    if not buckets:
        buckets.append(Bucket(0, control))
    return buckets


class GradViews:
    """Each parameter's ``.grad`` bound as a view of its slice of one flat gradient tensor (where its
    dtype and device match; the others, ``loose``, keep gradients of their own)."""

    def __init__(self, params: list[torch.Tensor], flat: torch.Tensor) -> None:
        self.params, self.flat = params, flat
        self.offsets: list[int] = []
        self.views: list[torch.Tensor | None] = []
        off = 0
        for p in params:
            fits = p.dtype == flat.dtype and p.device == flat.device
            self.offsets.append(off)
            self.views.append(flat[off : off + p.numel()].view(p.shape) if fits else None)
            off += p.numel()
        self.loose = [(p, off) for p, v, off in zip(params, self.views, self.offsets) if v is None]

    def bind(self) -> None:
        """Make each ``.grad`` its view again (the job or the optimizer may have replaced or dropped it)."""
        for p, view in zip(self.params, self.views):
            if view is not None and p.grad is not view:
                p.grad = view

    def drop_loose(self) -> None:
        """Drop the loose parameters' gradients, so that the next backward's are their own."""
        for p, _off in self.loose:
            p.grad = None

    def gather_loose(self) -> None:
        """Copy the loose parameters' gradients into the flat tensor (zeros where there is none)."""
        for p, off in self.loose:
            part = self.flat[off : off + p.numel()]
            part.copy_(p.grad.reshape(-1)) if p.grad is not None else part.zero_()

    def scatter_loose(self) -> None:
        """Give each loose parameter its slice of the flat tensor, in its own dtype, as its gradient."""
        for p, off in self.loose:
            p.grad = self.flat[off : off + p.numel()].view(p.shape).to(device=p.device, dtype=p.dtype)


class Overlap:
    """Counts gradients down to ready buckets during an armed backward and launches them in order."""

    def __init__(self, params: list[torch.Tensor], offsets: list[int], buckets: list[Bucket], control: int,
                 launch: Callable[[int, Bucket], None]) -> None:
        """``offsets[i]``: where parameter i's gradient starts among the gradient elements (the buffer
        index less ``control``); ``launch(k, bucket)`` converts bucket k if needed and starts its
        collective."""
        self.buckets, self._launch = buckets, launch
        self._waiting = [0] * len(buckets)
        self._of_param: list[list[int]] = []
        for p, off in zip(params, offsets):
            lo, hi = control + off, control + off + p.numel()
            mine = [k for k, b in enumerate(buckets) if b.lo < hi and lo < b.hi] if p.numel() else []
            self._of_param.append(mine)
            for k in mine:
                self._waiting[k] += 1
        self._left: list[int] = []
        self._counted: list[bool] = []  # per parameter: its hook fired in this armed backward
        self._next = len(buckets)  # not armed
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(params)]

    def _hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def done(_param: torch.Tensor) -> None:
            if not self._counted:
                return  # not armed
            if self._counted[i]:
                if any(k < self._next for k in self._of_param[i]):
                    raise TwiceAccumulated(
                        f"parameter {i} (shape {tuple(_param.shape)}) got its gradient accumulated again after "
                        f"its bucket's sum started: a parameter used in several reentrant checkpoint segments "
                        f"(torch.utils.checkpoint with use_reentrant=True) is accumulated once per segment; "
                        f"use use_reentrant=False, whose single backward accumulates it once")
                return
            self._counted[i] = True
            if self._next >= len(self.buckets):
                return
            for k in self._of_param[i]:
                self._left[k] -= 1
            self._launch_ready()
        return done

    def arm(self) -> None:
        """The next backward is the step's last on this rank: launch buckets as they fill."""
        self._left = list(self._waiting)
        self._counted = [False] * len(self._of_param)
        self._next = 0

    @property
    def armed(self) -> bool:
        """Whether buckets remain to be launched this step."""
        return self._next < len(self.buckets)

    def _launch_ready(self) -> None:
        while self._next < len(self.buckets) and self._left[self._next] <= 0:
            k, self._next = self._next, self._next + 1
            self._launch(k, self.buckets[k])

    def finish(self) -> None:
        """Backward returned: launch every bucket not launched yet, in order."""
        while self._next < len(self.buckets):
            k, self._next = self._next, self._next + 1
            self._launch(k, self.buckets[k])
        self._counted = []

    def disarm(self) -> None:
        """Launch nothing more this step (a redo, or a failure, reduces otherwise)."""
        self._next = len(self.buckets)
        self._counted = []

    def close(self) -> None:
        """Remove the hooks from the parameters."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
