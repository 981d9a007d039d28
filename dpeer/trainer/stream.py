"""A streaming (iterable) dataset read at positions: the runtime decides which stream items a rank's
micro-batches hold (sampler.InOrderSampler: step ``s`` consumes items ``[s*B, (s+1)*B)``), and this
reader fetches them, in whichever process fetches them.

The position is a function of the committed step, so it is healed and checkpointed with the step:
nothing else is saved. An epoch is ``len(dataset)`` items; the stream is opened again for each
epoch (``set_epoch(e)`` first, when the dataset has it, so it can reshuffle its shards from a seed).
A stream without ``__len__`` is read once: its epoch is the whole run (``steps * global_batch``).

How a position is reached, cheapest first:
- ``dataset.seek(position)``: the next ``iter(dataset)`` starts at item ``position`` of the epoch
  (ShardedStream implements it over shards of known lengths: it opens the shard that holds it);
- otherwise the stream is read from its start and the items before the position are discarded:
  a resumed or re-planned rank reads up to an epoch it does not train, and each loader worker
  process reads the items of the others' micro-batches too (the cost of a plain iterable).

Random draws the stream makes while it yields an item (augmentation in ``__iter__``) are seeded from
(seed, position): torch's, Python's and numpy's generators are seeded before each item is read, so an
item draws the same whether it is trained or discarded, on any rank and in any loader worker.

A dataset that shards itself by ``torch.utils.data.get_worker_info()`` would give each loader worker
a part of the stream; the reader hides the worker's info while it reads (get_worker_info() returns
None), so every process sees the whole stream and positions mean the same everywhere.
"""

from __future__ import annotations

import bisect
import random
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch.utils.data import Dataset, IterableDataset
from torch.utils.data._utils import worker as _worker

from dpeer.trainer.sampler import micro_batch_seed

ITEM_SALT = 0x57EA_11E5  # an item's stream differs from a micro-batch's (the same key otherwise)


class StreamEnded(RuntimeError):
    """The stream has fewer items than its length (or the run) needs; the text says which."""


@contextmanager
def _whole_stream() -> Iterator[None]:
    """Hide a loader worker's info while the stream is read (see the module)."""
    saved = _worker._worker_info
    _worker._worker_info = None
    try:
        yield
    finally:
        _worker._worker_info = saved


def stream_length(stream: Any) -> int | None:
    """``len(stream)``, or None when it has no length."""
    try:
        return len(stream)
    except TypeError:
        return None


class StreamReader(Dataset):
    """A map-style view of an iterable ``stream``: item ``p`` is stream position ``p`` (epoch
    ``p // length``, item ``p % length`` of it). Reads go forward; one that goes back reopens."""

    def __init__(self, stream: Iterable[Any], length: int, sampler: Any, name: str, bounded: bool,
                 seed: int = 0) -> None:
        self.stream, self.length, self.sampler, self.name, self.seed = stream, length, sampler, name, seed
        self.bounded = bounded  # the length is the stream's own (False: the run's, one pass)
        self.seekable = callable(getattr(stream, "seek", None))
        self.discarded = 0  # items read and thrown away to reach a position (this process)
        self._it: Iterator[Any] | None = None
        self._epoch, self._pos = -1, 0

    def __len__(self) -> int:
        return self.length

    def __getstate__(self) -> dict[str, Any]:  # a spawned loader worker gets no open iterator
        state = dict(self.__dict__)
        state["_it"], state["_epoch"], state["_pos"] = None, -1, 0
        return state

    def position(self, step: int, index: int) -> int:
        """The stream position of within-epoch ``index`` in ``step``'s batch."""
        return self.sampler.position(step, index)

    def __getitem__(self, position: int) -> Any:
        epoch, offset = divmod(position, self.length)
        with _whole_stream():
            if self._it is None or epoch != self._epoch or offset < self._pos:
                self._open(epoch, offset)
            elif offset > self._pos and self.seekable:
                self._open(epoch, offset)
            while self._pos < offset:
                self._next(epoch)
                self.discarded += 1
            return self._next(epoch)

    def _open(self, epoch: int, offset: int) -> None:
        set_epoch = getattr(self.stream, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        if self.seekable:
            self.stream.seek(offset)  # type: ignore[attr-defined]
        self._it, self._epoch, self._pos = iter(self.stream), epoch, offset if self.seekable else 0

    def _next(self, epoch: int) -> Any:
        assert self._it is not None
        seed = micro_batch_seed(self.seed ^ ITEM_SALT, epoch, self._pos)
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        np = sys.modules.get("numpy")
        if np is not None:
            np.random.seed(seed & 0xFFFFFFFF)
        try:
            item = next(self._it)
        except StopIteration:
            self._it = None
            if self.bounded:
                raise StreamEnded(f"the stream {self.name} ended after {self._pos} items of epoch {epoch}, but its "
                                  f"len() is {self.length}: __len__ must count the items one pass of __iter__ "
                                  f"yields") from None
            raise StreamEnded(f"the stream {self.name} ended after {self._pos} items, but the run's steps need "
                              f"{self.length} (training.steps * training.global_batch): give it more items, or a "
                              f"__len__ (then each epoch reads it again from its start)") from None
        self._pos += 1
        return item


class ShardedStream(IterableDataset):
    """A stream made of shards read in order (files, say), each of a known length: ``open(k)`` returns
    an iterable over shard ``k``'s items, ``lengths[k]`` of them. It seeks (StreamReader): a position
    opens the shard that holds it and skips inside that shard only. ``order(epoch)``, when given,
    returns the shards' order for an epoch (a seeded shuffle of ``range(len(lengths))``)."""

    def __init__(self, lengths: Sequence[int], open: Callable[[int], Iterable[Any]],  # noqa: A002 - the shard's opener
                 order: Callable[[int], Sequence[int]] | None = None) -> None:
        if not lengths or any(n < 0 for n in lengths):
            raise ValueError("ShardedStream needs one non-negative length per shard")
        self.lengths, self.open, self.order = list(lengths), open, order
        self._epoch, self._start = 0, 0

    def __len__(self) -> int:
        return sum(self.lengths)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter`` reads (its shard order)."""
        self._epoch = epoch

    def seek(self, position: int) -> None:
        """The next ``iter`` starts at item ``position`` of the epoch."""
        self._start = position

    def __iter__(self) -> Iterator[Any]:
        shards = list(self.order(self._epoch)) if self.order is not None else list(range(len(self.lengths)))
        if sorted(shards) != list(range(len(self.lengths))):
            raise ValueError(f"ShardedStream: order({self._epoch}) must be a permutation of the shards' numbers")
        ends, total = [], 0
        for k in shards:
            total += self.lengths[k]
            ends.append(total)
        first = bisect.bisect_right(ends, self._start)
        skip = self._start - (ends[first - 1] if first else 0)
        for n, k in enumerate(shards[first:]):
            items, got = iter(self.open(k)), 0
            for item in items:
                got += 1
                if n > 0 or got > skip:  # the first shard opened skips the items before the position
                    yield item
            if got != self.lengths[k]:
                raise StreamEnded(f"shard {k} gave {got} items, but its length is {self.lengths[k]}")
