"""The exact reduction's arithmetic (dpeer/trainer/fixedpoint.py): the same bits for any split of a
step's micro-batches over 1..N ranks and any summation order, integer sums that stay exact at the
limits, and the range and NaN/Inf checks."""

from __future__ import annotations

import random

import pytest
import torch

from dpeer.trainer import fixedpoint as fx
from dpeer.trainer.sampler import shard_bounds

M, NB = 6, 3
BITS = fx.fraction_bits(M)
LO, HI = fx.exponent_range(BITS, torch.float32)


def gradients(seed: int) -> list[torch.Tensor]:
    """M micro-batch gradients [NB, BUCKET] with magnitudes from subnormal to 2**20, zeros, -0.0."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(M):
        mag = torch.exp2(torch.randint(-140, 20, (NB, fx.BUCKET), generator=g).float())
        row = torch.randn(NB, fx.BUCKET, generator=g) * mag
        row[:, :7] = -0.0
        row[1, :] *= 2.0 ** -60  # a bucket of tiny gradients
        rows.append(row)
    rows[2][2, :] = 0.0  # a bucket all zero in one micro-batch
    return rows


def exponents_of(row: torch.Tensor) -> torch.Tensor:
    amax = torch.empty(row.shape[0], dtype=row.dtype)
    fx.bucket_amax(row, amax)
    return fx.bucket_exponents(amax, LO)


def measured_exponents(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([exponents_of(r) for r in rows]).amax(dim=0)


def rank_sums(rows: list[torch.Tensor], exps: torch.Tensor, world: int, rng: random.Random) -> list[torch.Tensor]:
    """Each rank's float64 sum of its contiguous micro-batches, added in a random order."""
    scale = fx.scales(exps, BITS, torch.float32, torch.device("cpu"))
    sums = []
    for rank in range(world):
        mine = list(range(*shard_bounds(M, rank, world)))
        rng.shuffle(mine)
        acc = torch.zeros(NB, fx.BUCKET, dtype=torch.float64)
        wide = torch.empty_like(acc)
        for i, j in enumerate(mine):
            fx.accumulate(acc, rows[j].clone(), scale, wide, first=i == 0)
        sums.append(acc)
    return sums


def tree_sum(parts: list[torch.Tensor], rng: random.Random) -> torch.Tensor:
    """Sum float64 tensors pairwise in a random tree, as some allreduce algorithm might."""
    parts = [p.clone() for p in parts]
    while len(parts) > 1:
        a, b = parts.pop(rng.randrange(len(parts))), parts.pop(rng.randrange(len(parts)))
        parts.append(a + b)
    return parts[0]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_any_split_over_1_to_n_ranks_and_any_order_gives_the_same_bits(seed: int) -> None:
    rows = gradients(seed)
    rng = random.Random(seed)
    for exps in (measured_exponents(rows), fx.next_exponents(measured_exponents(rows), None, LO, HI)):
        reference = None
        for world in range(1, M + 2):  # M + 1 ranks: one trains no micro-batch
            for _ in range(4):
                total = tree_sum(rank_sums(rows, exps, world, rng), rng)
                result = fx.finish(total, exps, BITS, 64, torch.empty(total.shape, dtype=torch.float32))
                if reference is None:
                    reference = result
                assert torch.equal(result.view(torch.int32), reference.view(torch.int32)), (world, seed)


def test_the_integer_sums_are_exact_and_close_to_the_true_mean() -> None:
    rows = gradients(4)
    exps = measured_exponents(rows)
    scale = fx.scales(exps, BITS, torch.float32, torch.device("cpu"))
    ints = [[[int(v) for v in (r * scale).round()[b, :64].double().tolist()] for b in range(NB)] for r in rows]
    total = tree_sum(rank_sums(rows, exps, 3, random.Random(0)), random.Random(1))
    for b in range(NB):
        assert [int(v) for v in total[b, :64].tolist()] == [sum(ints[j][b][k] for j in range(M)) for k in range(64)]
    mean = fx.finish(total, exps, BITS, M, torch.empty(total.shape, dtype=torch.float32))
    true = torch.stack([r.double() for r in rows]).sum(0) / M
    quantum = fx.pow2(exps - BITS).view(-1, 1).float()
    # quantized, then the sum and the factor each rounded to float32 once: a quantum and 2 ulps
    assert bool(((mean.double() - true).abs() <= quantum.double() + true.abs() * 2.0 ** -22).all())


def test_sums_at_the_bound_stay_exact() -> None:
    for micro in (1, 2, 3, 4, 5, 64, 1000, fx.MAX_MICRO_BATCHES):
        bits = fx.fraction_bits(micro)
        assert micro * 2 ** bits <= 2 ** 53 < 2 * micro * 2 ** bits
    exps = torch.tensor([0, 5, -30])
    biggest = torch.tensor([1 - 2.0 ** -24, 2.0 ** 5 * (1 - 2.0 ** -24), -(2.0 ** -30) * (1 - 2.0 ** -24)])
    row = biggest.view(3, 1).expand(3, fx.BUCKET).contiguous()
    acc = torch.zeros(3, fx.BUCKET, dtype=torch.float64)
    scale = fx.scales(exps, BITS, torch.float32, torch.device("cpu"))
    for i in range(M):
        fx.accumulate(acc, row.clone(), scale, torch.empty_like(acc), first=i == 0)
    top = 2 ** BITS - 2 ** (BITS - 24)  # the largest float32 below 2**E, scaled: already an integer
    assert acc[:, 0].tolist() == [M * top, M * top, -M * top]
    assert bool((acc.abs() <= 2 ** 53).all())


def test_micro_batch_counts_outside_the_range_are_refused() -> None:
    for bad in (0, fx.MAX_MICRO_BATCHES + 1):
        with pytest.raises(ValueError, match="micro-batches per step"):
            fx.fraction_bits(bad)
    assert (fx.fraction_bits(1), fx.fraction_bits(4), fx.fraction_bits(5)) == (53, 51, 50)


def test_bucket_exponents_report_zeros_nans_and_infs() -> None:
    row = torch.zeros(5, fx.BUCKET)
    row[0, 3], row[1, 0], row[2, 9], row[3, 1] = 3.0, float("nan"), float("-inf"), -2.0 ** -200
    row[4, 0] = 2.0 ** -149  # the smallest subnormal
    assert exponents_of(row).tolist() == [2, fx.NONFINITE, fx.NONFINITE, LO, LO]
    assert exponents_of(torch.full((1, fx.BUCKET), 0.75)).tolist() == [0]


def test_the_exponent_range_keeps_every_scale_a_normal_float32() -> None:
    for exps in (torch.tensor([LO]), torch.tensor([HI])):
        s = fx.scales(exps, BITS, torch.float32, torch.device("cpu"))
        assert torch.isfinite(s).all() and bool((s >= torch.finfo(torch.float32).tiny).all())
    assert fx.pow2(torch.tensor([-1022, 0, 1023])).tolist() == [2.0 ** -1022, 1.0, 2.0 ** 1023]
    assert LO <= -76 and HI >= 128  # any finite float32 gradient fits below 2**HI


def test_next_exponents_grow_with_headroom_fall_slowly_and_keep_a_floor() -> None:
    measured = torch.tensor([-3, -40, LO, -2])
    previous = torch.tensor([0, 5, -60, 0])
    nxt = fx.next_exponents(measured, previous, LO, HI)
    floor = -2 - fx.FLOOR_GAP
    assert nxt.tolist() == [-3 + fx.HEADROOM, 5 - 1, floor, -2 + fx.HEADROOM]
    assert fx.next_exponents(torch.tensor([HI, HI]), None, LO, HI).tolist() == [HI, HI]


def test_finish_turns_negative_zero_into_positive_zero() -> None:
    acc = torch.tensor([[-0.0, 0.0, -3.0]], dtype=torch.float64)
    for dtype in (torch.float32, torch.float64):
        out = fx.finish(acc, torch.tensor([BITS]), BITS, 1, torch.empty(1, 3, dtype=dtype))
        assert [str(v) for v in out[0].tolist()] == ["0.0", "0.0", "-3.0"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finish_has_the_bits_of_one_addcmul_over_the_whole_row(dtype: torch.dtype) -> None:
    """finish works a chunk at a time and, where every factor is normal, multiplies then adds 0.0;
    its bits are those of 0 + f(integers) * factor in one addcmul, at the exponent range's ends too
    (where a factor is subnormal, and products round to zeros of either sign)."""
    g = torch.Generator().manual_seed(5)
    lo, hi = fx.exponent_range(BITS, dtype)
    rows = 3 * fx.chunk_rows(dtype) + 5
    acc = torch.randint(-(2 ** 20), 2 ** 20, (rows, fx.BUCKET), generator=g).to(torch.float64)
    acc *= torch.exp2(torch.randint(0, 33, (rows, fx.BUCKET), generator=g).to(torch.float64))
    acc[:, :9] = torch.tensor([-0.0, 0.0, 1.0, -1.0, 2.0 ** 53, -(2.0 ** 53), 3.0, -3.0, 2.0 ** 53 - 1])
    bits_of = torch.int32 if dtype == torch.float32 else torch.int64
    for exponents in (torch.randint(lo + 8, hi - 60, (rows,), generator=g),  # every factor normal
                      torch.randint(lo, hi + 1, (rows,), generator=g), torch.full((rows,), lo),
                      torch.full((rows,), hi), torch.full((rows,), BITS)):
        for samples in (1, 3, 64):
            out = fx.finish(acc, exponents, BITS, samples, torch.empty(rows, fx.BUCKET, dtype=dtype))
            factor = (fx.pow2(exponents - BITS) / samples).to(dtype).view(-1, 1)
            want = torch.addcmul(torch.zeros((), dtype=dtype), acc.to(dtype), factor)
            assert torch.equal(out.view(bits_of), want.view(bits_of))


def test_config_check_bounds_micro_batches_as_exact_sums_do() -> None:
    """The config (which loads no torch) refuses what fraction_bits would refuse at build."""
    from dpeer.daemon.config import EXACT_MAX_MICRO_BATCHES, TrainingConfig

    assert EXACT_MAX_MICRO_BATCHES == fx.MAX_MICRO_BATCHES
    TrainingConfig(global_batch=EXACT_MAX_MICRO_BATCHES, micro_batch=1)
    with pytest.raises(ValueError, match="at most 65536 micro-batches"):
        TrainingConfig(global_batch=2 * EXACT_MAX_MICRO_BATCHES, micro_batch=1)
    TrainingConfig(global_batch=2 * EXACT_MAX_MICRO_BATCHES, micro_batch=1, reduction="fast")
