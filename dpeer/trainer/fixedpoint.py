"""Fixed-point gradient sums whose result does not depend on who summed what, or in what order.

Gradients are laid out flat in buckets of ``BUCKET`` elements. Each bucket b has an exponent E_b,
agreed by the whole group, with every |gradient| of the bucket below 2**E_b. A micro-batch's
gradient g is turned into integers q = round(g * 2**(B - E_b)) (one power-of-two scaling, exact,
then one rounding per element that depends on g and E_b only), so |q| <= 2**B. With
B = fraction_bits(M), the sum of the M micro-batches' q is at most 2**53 in magnitude, so every
partial sum, whichever ranks formed it and in whatever order, is an integer that float64 holds
exactly: float64 addition of these values is associative. The group's float64 SUM allreduce
therefore yields the same integers everywhere, and one conversion back (finish: q_sum rounded to the
parameter's dtype, times 2**(E_b - B) / samples rounded to it) gives the same bits on every rank
and in every world size.

The method, by measurement (scripts/bench_exact.py; a 2-core box shared with other jobs, so the
figures are rough): exponents agreed in their own MAX allreduce before the sum would add a second
collective per step, and on the demo's sizes at world 3 that small allreduce took 1.8 ms against
3.9 ms for the fast path's whole float32 sum (--collectives): 45 % on the demo, three times the
15 % budget. So each step's exponents come from the previous step's allreduce, where every rank's
measured exponents ride as slots, and one allreduce per step remains (float64 with slots: 4.8 ms
there). Gathering every micro-batch's float32 gradient instead (exact with no fixed point) costs
4*M bytes per parameter (5.1 ms for M = 4 at demo size, and M times the fast path's bytes on large
models). Integers in float64 rather than int64: per micro-batch at 10.4M parameters, 64 ms
against 119 ms (--methods), no int64 <-> float conversions, and B = 53 - ceil(log2 M) bits is far
more than a float32 gradient's 24.

Limits, all checked where they are used:
- micro-batches per step M <= MAX_MICRO_BATCHES (2**16), so B >= 37 (checked at build);
- precision: an element keeps every bit of its float32 value when it is at least 2**(E_b - B + 24)
  (for M = 4, B = 51: 2**(E_b - 27)); smaller elements are rounded to a multiple of 2**(E_b - B).
  E_b is HEADROOM bits above the bucket's largest magnitude of the previous step, or more when the
  bucket's gradients shrank or lie far below the step's largest (see next_exponents);
- range: E_b is kept where 2**(B - E_b) is a normal number of the gradient's dtype
  (exponent_range); a bucket whose gradients are all below 2**lo is rounded at 2**(lo - B), for
  float32 2**-127 absolute;
- a NaN or an Inf in a gradient is reported as the NONFINITE exponent (the caller raises);
- a gradient at or above 2**E_b (it grew faster than HEADROOM allows) is an overflow the caller
  handles by redoing the sum with the exponents the group just measured, never by wrapping.
"""

from __future__ import annotations

import math

import torch

BUCKET = 1024
HEADROOM = 4  # bits of growth of a bucket's largest gradient from one step to the next before a redo
FLOOR_GAP = 2  # no bucket's exponent is set more than this many bits below the step's largest gradient's
MAX_MICRO_BATCHES = 1 << 16
CHUNK_BYTES = 1 << 20  # float64 bytes a conversion pass holds in cache at a time (chunk_rows)
NONFINITE = 1 << 20  # the exponent reported for a bucket holding a NaN or an Inf


def fraction_bits(micro_batches: int) -> int:
    """B such that ``micro_batches`` values of magnitude at most 2**B sum to at most 2**53."""
    if not 1 <= micro_batches <= MAX_MICRO_BATCHES:
        raise ValueError(f"{micro_batches} micro-batches per step: exact sums allow 1..{MAX_MICRO_BATCHES}")
    return 53 - (micro_batches - 1).bit_length()


def exponent_range(bits: int, dtype: torch.dtype) -> tuple[int, int]:
    """The lowest and highest E for which the scale 2**(bits - E) is a normal number of ``dtype``."""
    info = torch.finfo(dtype)
    return bits - (math.frexp(info.max)[1] - 1), bits - (math.frexp(info.tiny)[1] - 1)


def pow2(exponents: torch.Tensor) -> torch.Tensor:
    """Exactly 2**k in float64 for each int64 k in [-1022, 1023], built from its bit pattern."""
    return ((exponents.to(torch.int64) + 1023) << 52).view(torch.float64)


def bucket_amax(row: torch.Tensor, out: torch.Tensor) -> None:
    """Each bucket's largest magnitude in ``row`` ([buckets, BUCKET]) into ``out`` (NaN propagates),
    as max(max g, -min g): two reading passes and no |row| copy (torch.aminmax along a bucket is
    ten times slower here)."""
    torch.amax(row, dim=1, out=out)
    torch.maximum(out, torch.amin(row, dim=1).neg_(), out=out)


def bucket_exponents(amax: torch.Tensor, lo: int) -> torch.Tensor:
    """Per bucket, from its largest magnitude, the least e >= lo with every |g| < 2**e (lo for an
    all-zero bucket), or NONFINITE where the bucket holds a NaN or an Inf."""
    e = torch.frexp(amax).exponent.to(torch.int64).clamp_(min=lo)
    e.masked_fill_(amax == 0, lo)
    return e.masked_fill_(~torch.isfinite(amax), NONFINITE)


def scales(exponents: torch.Tensor, bits: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The per-bucket factors 2**(bits - E), shaped to broadcast over [buckets, BUCKET]."""
    return pow2(bits - exponents).to(device=device, dtype=dtype).view(-1, 1)


def chunk_rows(dtype: torch.dtype) -> int:
    """Buckets a conversion pass takes at a time: one chunk's float64 values (CHUNK_BYTES) stay in
    the cache between the chunk's operations (measured at 4.7M parameters, one thread: the
    quantize-and-add pass 5.2 ms whole, 3.5 ms in chunks of 128 buckets)."""
    return max(1, CHUNK_BYTES // (BUCKET * torch.finfo(torch.float64).bits // 8))


def quantize(row: torch.Tensor, scale: torch.Tensor | None, amax: torch.Tensor, acc: torch.Tensor | None,
             wide: torch.Tensor | None, first: bool = False) -> None:
    """One chunked pass over ``row`` ([buckets, BUCKET]): each bucket's largest magnitude into
    ``amax`` (bucket_amax), then, unless ``scale`` is None (a pass that only measures),
    acc += round(row * scale) (acc = ..., when ``first``) as ``accumulate`` does."""
    step = chunk_rows(row.dtype)
    for r0 in range(0, row.shape[0], step):
        r1 = min(row.shape[0], r0 + step)
        part = row[r0:r1]
        bucket_amax(part, amax[r0:r1])
        if scale is not None and acc is not None:
            _accumulate(acc[r0:r1], part, scale[r0:r1], wide, first)


def accumulate(acc: torch.Tensor, row: torch.Tensor, scale: torch.Tensor, wide: torch.Tensor | None,
               first: bool = False) -> None:
    """acc += round(row * scale) (acc = ..., when ``first``), in place; ``row`` is overwritten by its
    integers, and ``wide`` (a float64 scratch of at least ``chunk_rows`` buckets on acc's device;
    None when row is float64 on acc's device) receives them before the add, a chunk at a time (a
    mixed float64 += float32 add takes torch's slow path: 17 ms against 2.8 at 4.7M parameters)."""
    step = chunk_rows(row.dtype)
    for r0 in range(0, row.shape[0], step):
        r1 = min(row.shape[0], r0 + step)
        _accumulate(acc[r0:r1], row[r0:r1], scale[r0:r1], wide, first)


def _accumulate(acc: torch.Tensor, row: torch.Tensor, scale: torch.Tensor, wide: torch.Tensor | None,
                first: bool) -> None:
    row.mul_(scale).round_()
    if first:
        acc.copy_(row)
    elif wide is None:
        acc.add_(row)
    else:
        w = wide.view(-1)[: row.numel()].view(row.shape)
        w.copy_(row)
        acc.add_(w)


def finish(acc: torch.Tensor, exponents: torch.Tensor, bits: int, samples: int, out: torch.Tensor) -> torch.Tensor:
    """Turn the summed integers back into the mean gradient, written into ``out`` (the gradients'
    row, of their dtype) in two passes: the integers converted to out's dtype (rounded to its
    precision when they need more bits), then 0 + that * (2**(E - bits) / samples), the factor
    rounded once per bucket to out's dtype (any fixed formula serves: every rank and every world size
    computes this one from the same integers). Adding +0.0 turns the -0.0 that rounding a small
    negative gives into +0.0, as the collective's sum with other ranks' zeros does, so a 1-rank
    group ends with the same bits as a larger one. A float64 pass over the sums costs several times
    a float32 one here, so none is made.

    Computed a chunk at a time. Where every factor is a normal number, a nonzero integer's product
    is too (|integer| >= 1), so the product is one rounding whether fused with the + 0 or not, and
    only a zero's sign can differ: the chunk is multiplied, then 0.0 added (two passes in cache,
    2.41 ms for addcmul's one at 4.7M parameters against 0.8). Otherwise (a factor below the
    smallest normal, where a product may round to a zero) addcmul computes 0 + that * factor."""
    factor = (pow2(exponents - bits) / samples).to(dtype=out.dtype)
    normal = bool((factor >= torch.finfo(out.dtype).tiny).all())  # where the exponents are (the CPU)
    factor = factor.to(device=out.device).view(-1, 1)
    zero = None if normal else torch.zeros((), dtype=out.dtype, device=out.device)
    step = chunk_rows(out.dtype)
    for r0 in range(0, out.shape[0], step):
        r1 = min(out.shape[0], r0 + step)
        part = out[r0:r1]
        part.copy_(acc[r0:r1])
        if zero is None:
            part.mul_(factor[r0:r1]).add_(0.0)
        else:
            torch.addcmul(zero, part, factor[r0:r1], out=part)
    return out


def next_exponents(measured: torch.Tensor, previous: torch.Tensor | None, lo: int, hi: int) -> torch.Tensor:
    """The next step's exponents: per bucket, the largest of its measured exponent plus HEADROOM,
    its previous exponent minus one (a slow fall) and the step's largest measured exponent minus
    FLOOR_GAP, within [lo, hi].

    Without the floor, a bucket whose gradients vanished for a step (a unit whose ReLU was off for
    the whole batch) sits at lo and overflows as soon as the unit comes back: measured on the
    10.4M-parameter demo, HEADROOM alone redid every step (6-30 of 10,138 buckets each time) and so
    did a floor 8 bits below the largest; 2 bits below redid only the first step in 25."""
    grown = measured + HEADROOM
    if previous is not None:
        grown = torch.maximum(grown, previous.to(grown.device) - 1)
    grown = torch.maximum(grown, measured.max() - FLOOR_GAP)
    return grown.clamp_(min=lo, max=hi)
