"""Deterministic global-batch sampling: which dataset indices each step consumes, and how a step's
indices are split across the ranks of the current group.

Pure Python, no torch: step ``s`` consumes positions ``[s*B, (s+1)*B)`` of an endless stream made
of one seeded permutation of ``range(dataset_len)`` per epoch. The permutation is a keyed Feistel
network with cycle-walking, so any index is computed in O(1) without materialising the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from dpeer.view import share_counts

_MASK64 = (1 << 64) - 1
_ROUNDS = 6
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix64(x: int) -> int:
    """SplitMix64 finaliser: a fast, well-distributed 64-bit integer hash."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * _MIX1) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX2) & _MASK64
    return x ^ (x >> 31)


class FeistelPermutation:
    """A keyed bijection of ``range(n)`` (balanced Feistel network plus cycle-walking)."""

    def __init__(self, n: int, key: int) -> None:
        if n <= 0:
            raise ValueError(f"permutation domain must be positive, got {n}")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        bits += bits % 2
        self._half = bits // 2
        self._half_mask = (1 << self._half) - 1
        self._keys = [_mix64((key & _MASK64) ^ _mix64(r + 1)) for r in range(_ROUNDS)]

    def _encrypt(self, x: int) -> int:
        """One pass of the network; the round function is ``_mix64(right ^ key)``, written out here
        because this runs about 150 times a step (a call each costs as much as the arithmetic)."""
        half, mask, m64 = self._half, self._half_mask, _MASK64
        left, right = x >> half, x & mask
        for k in self._keys:
            z = ((right ^ k) + _GOLDEN) & m64
            z = ((z ^ (z >> 30)) * _MIX1) & m64
            z = ((z ^ (z >> 27)) * _MIX2) & m64
            left, right = right, left ^ ((z ^ (z >> 31)) & mask)
        return (left << half) | right

    def __call__(self, i: int) -> int:
        """Return the image of ``i`` (0 <= i < n)."""
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} outside permutation domain {self.n}")
        return self._image(i)

    def _image(self, i: int) -> int:
        x = self._encrypt(i)
        while x >= self.n:
            x = self._encrypt(x)
        return x

    def images(self, start: int, count: int) -> list[int]:
        """The images of ``start .. start + count - 1``, all inside the domain."""
        if not 0 <= start <= start + count <= self.n:
            raise IndexError(f"range {start}+{count} outside permutation domain {self.n}")
        return [self._image(i) for i in range(start, start + count)]


@dataclass(frozen=True)
class GlobalBatchSampler:
    """Maps a step number to its fixed, seeded list of ``global_batch`` dataset indices."""

    dataset_len: int
    global_batch: int
    seed: int

    def __post_init__(self) -> None:
        if self.dataset_len <= 0 or self.global_batch <= 0:
            raise ValueError("dataset_len and global_batch must be positive")

    def indices_for_step(self, step: int) -> list[int]:
        """Global sample indices consumed by ``step`` (same on every node, any world size)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return list(_step_indices(self.dataset_len, self.global_batch, self.seed, step))

    def cursor_after(self, step: int) -> int:
        """Stream position (samples consumed) once ``step`` steps are committed."""
        return step * self.global_batch


@lru_cache(maxsize=8)
def _step_indices(dataset_len: int, global_batch: int, seed: int, step: int) -> tuple[int, ...]:
    """A step's indices, computed once however many ask (the stepper's plan and a script job's
    loader both read the step about to train)."""
    out: list[int] = []
    pos, end = step * global_batch, (step + 1) * global_batch
    while pos < end:
        epoch, offset = divmod(pos, dataset_len)
        take = min(end - pos, dataset_len - offset)
        out.extend(_epoch_permutation(dataset_len, seed, epoch).images(offset, take))
        pos += take
    return tuple(out)


@lru_cache(maxsize=8)
def _epoch_permutation(n: int, seed: int, epoch: int) -> FeistelPermutation:
    """Epoch ``epoch``'s permutation of ``range(n)``: built once, not at every step (its keys cost
    six hashes); a step reads at most two epochs, the audit walks them in order."""
    return FeistelPermutation(n, _mix64(seed * 0x100000001B3 + epoch))


def shard_bounds(total: int, rank: int, world: int, shares: Sequence[int] = ()) -> tuple[int, int]:
    """Contiguous ``[start, end)`` of rank's share of ``total`` items: even (the first ranks get the
    remainder), or weighted by ``shares`` (one positive weight a rank, View.shares)."""
    if world <= 0 or not 0 <= rank < world:
        raise ValueError(f"bad rank {rank} for world {world}")
    if shares:
        counts = share_counts(total, shares)
        if len(counts) != world:
            raise ValueError(f"{len(shares)} shares for world {world}")
        start = sum(counts[:rank])
        return start, start + counts[rank]
    base, extra = divmod(total, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard(indices: list[int], rank: int, world: int, shares: Sequence[int] = ()) -> list[int]:
    """This rank's contiguous, deterministic slice of a step's global indices (weighted by ``shares``)."""
    start, end = shard_bounds(len(indices), rank, world, shares)
    return indices[start:end]


def micro_batches(indices: list[int], micro_bs: int) -> list[list[int]]:
    """Split a rank's share into micro-batches of at most ``micro_bs`` for gradient accumulation."""
    if micro_bs <= 0:
        raise ValueError(f"micro batch must be positive, got {micro_bs}")
    return [indices[i : i + micro_bs] for i in range(0, len(indices), micro_bs)]


def micro_batch_seed(seed: int, step: int, index: int) -> int:
    """The torch seed of micro-batch ``index`` of ``step``: a function of the run's seed, the step and
    the micro-batch only, so its random draws (dropout) are the same on whichever rank runs it,
    in any world size, and again when a failed step is redone."""
    x = _mix64(_mix64(_mix64(seed & _MASK64) ^ (step & _MASK64)) ^ (index & _MASK64))
    return x >> 1  # torch.manual_seed takes a non-negative 63-bit value


def micro_batch_slice(indices: list[int], micro_bs: int, index: int) -> list[int]:
    """The dataset indices of micro-batch ``index`` of a step whose global indices are ``indices``."""
    return indices[index * micro_bs : (index + 1) * micro_bs]


@dataclass(frozen=True)
class InOrderSampler:
    """The data read in order, as a stream is: step ``s`` consumes positions ``[s*B, (s+1)*B)`` of the
    endless sequence made of ``range(dataset_len)`` once per epoch (no shuffle: a stream that wants
    one shuffles its own epoch, from ``set_epoch``). A step's "indices" are positions within their
    epoch, so the ledger and the audit read them as for the seeded sampler."""

    dataset_len: int
    global_batch: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dataset_len <= 0 or self.global_batch <= 0:
            raise ValueError("dataset_len and global_batch must be positive")
        if self.global_batch > self.dataset_len:
            raise ValueError(f"a stream of {self.dataset_len} items cannot feed a global batch of "
                             f"{self.global_batch}: a step would read an item twice")

    def indices_for_step(self, step: int) -> list[int]:
        """The within-epoch positions ``step`` consumes, in order."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        base, n = step * self.global_batch, self.dataset_len
        return [(base + k) % n for k in range(self.global_batch)]

    def position(self, step: int, index: int) -> int:
        """The stream position (``epoch * dataset_len + index``) of ``index`` in ``step``'s batch."""
        base = step * self.global_batch
        return base + (index - base) % self.dataset_len

    def cursor_after(self, step: int) -> int:
        """Stream position (items consumed) once ``step`` steps are committed."""
        return step * self.global_batch


@dataclass(frozen=True)
class StreamsSampler:
    """The corpus read in order as ``global_batch`` parallel streams (truncated BPTT): the dataset is a
    sequence of ``windows``; stream ``b`` is the contiguous windows ``[b*L, (b+1)*L)`` with
    ``L = windows // global_batch`` (the last ``windows % global_batch`` windows are not read), and
    step ``s``'s global batch is window ``s mod L`` of every stream, row ``b`` being stream ``b``.
    An epoch is ``L`` steps; each step reads every stream once, so a carried state has one row per
    stream (carry.Carried)."""

    windows: int
    global_batch: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.global_batch <= 0 or self.windows < self.global_batch:
            raise ValueError(f"order='streams' needs at least one window per stream: {self.windows} windows "
                             f"for {self.global_batch} streams (training.global_batch)")

    @property
    def stream_length(self) -> int:
        """Windows per stream, ``L``: the steps of an epoch."""
        return self.windows // self.global_batch

    @property
    def dataset_len(self) -> int:
        """The windows an epoch reads (``L * global_batch``): the audit's epoch."""
        return self.stream_length * self.global_batch

    def indices_for_step(self, step: int) -> list[int]:
        """Window ``step mod L`` of each stream, stream 0 first."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        length = self.stream_length
        t = step % length
        return [b * length + t for b in range(self.global_batch)]

    def stream_of(self, index: int) -> int:
        """The stream (the carried state's row) that window ``index`` belongs to."""
        return index // self.stream_length

    def epoch_starts(self, step: int) -> bool:
        """Whether ``step`` reads the first window of every stream (a carried state starts afresh)."""
        return step % self.stream_length == 0

    def cursor_after(self, step: int) -> int:
        """Windows consumed once ``step`` steps are committed."""
        return step * self.global_batch
