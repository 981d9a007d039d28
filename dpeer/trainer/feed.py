"""Where a step's micro-batches come from: the runtime's sampler decides which samples each holds;
a feed fetches and collates them.

``InlineFeed`` (a TrainSpec job) fetches on the training thread, inside the micro-batch's seeded
random stream. ``LoaderFeed`` (a script job) runs the job's own ``DataLoader`` settings
(``num_workers``, ``prefetch_factor``, ``pin_memory``, ``collate_fn``, ``persistent_workers``)
over a batch sampler that yields this rank's micro-batches step after step, so worker processes
fetch ahead while the model computes. Each micro-batch's fetch and collate run with Python's
and torch's generators seeded from (seed, step, micro-batch), in whichever process fetches it,
so random augmentation draws the same on any rank, in any world size, and again on a redo.

A streaming (iterable) dataset is fetched through a ``stream.StreamReader`` that script.py builds:
its "indices" are positions within an epoch, mapped to stream positions from the step.
"""

from __future__ import annotations

import random
import sys
import traceback
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader

from dpeer.trainer.sampler import micro_batch_seed

DATA_SALT = 0x5EED_DA7A  # the data's stream differs from the forward's (the same key otherwise)
Plan = Callable[[int], "list[tuple[int, list[int]]]"]  # step -> this rank's (micro-batch id, indices)


class FeedError(RuntimeError):
    """The job's data pipeline cannot feed exact steps; the text says what to change."""


class InlineFeed:
    """Fetch and collate a micro-batch on the training thread (a TrainSpec job's dataset and collate)."""

    def __init__(self, dataset: Any, collate: Callable[[Sequence[Any]], Any]) -> None:
        self.dataset, self.collate = dataset, collate

    def get(self, step: int, j: int, indices: list[int]) -> Any:
        """The collated samples ``indices`` (micro-batch ``j`` of ``step``)."""
        return self.collate([self.dataset[i] for i in indices])

    def replan(self, plan: Plan) -> None:
        """Nothing is fetched ahead."""

    def close(self) -> None:
        """Nothing to stop."""


def structure(batch: Any) -> Any:
    """What a batch is made of, without its sizes: types, keys, tensor dtypes and dimensions."""
    if isinstance(batch, torch.Tensor):
        return ("tensor", str(batch.dtype), batch.dim())
    if isinstance(batch, dict):
        return ("dict", tuple((k, structure(v)) for k, v in batch.items()))
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, tuple(structure(v) for v in batch))
    return type(batch).__name__


class _Keys:
    """A batch sampler of the micro-batches this rank trains from a step on, one list per micro-batch:
    each entry ``(step, j, seed, index)``. Endless: the loop asks only for what it trains."""

    def __init__(self, seed: int) -> None:
        self.seed, self.start = seed, 0
        self.plan: Plan | None = None

    def __iter__(self) -> Iterator[list[tuple[int, int, int, int]]]:
        step, plan = self.start, self.plan
        assert plan is not None
        while True:
            for j, indices in plan(step):
                seed = micro_batch_seed(self.seed ^ DATA_SALT, step, j)
                yield [(step, j, seed, i) for i in indices]
            step += 1


class _Keyed(torch.utils.data.Dataset):
    """The job's dataset as the loader sees it: a fetch hands the keys through to the collate."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitems__(self, keys: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
        return keys

    def __getitem__(self, key: tuple[int, int, int, int]) -> Any:
        raise TypeError("a keyed dataset is fetched a micro-batch at a time")


class _SeededCollate:
    """Fetch and collate one micro-batch under its own seeded generators (torch's CPU one, Python's,
    and numpy's when loaded), then put them back; returns ``((step, j), batch)``."""

    def __init__(self, dataset: Any, collate: Callable[[list[Any]], Any]) -> None:
        self.dataset, self.collate = dataset, collate

    def __call__(self, keys: list[tuple[int, int, int, int]]) -> tuple[tuple[int, int], Any]:
        step, j, seed, _ = keys[0]
        at = getattr(self.dataset, "position", None)  # a stream: within-epoch index -> stream position
        indices = [k[3] for k in keys] if at is None else [at(step, k[3]) for k in keys]
        np = sys.modules.get("numpy")
        saved = (torch.get_rng_state(), random.getstate(), np.random.get_state() if np is not None else None)
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        if np is not None:
            np.random.seed(seed & 0xFFFFFFFF)
        try:
            return (step, j), fetch(self.dataset, self.collate, indices, f"step {step} micro-batch {j}")
        finally:
            torch.set_rng_state(saved[0])
            random.setstate(saved[1])
            if np is not None:
                np.random.set_state(saved[2])


def _origin(exc: BaseException) -> str:
    """Where ``exc`` was raised: the innermost frame outside torch and dpeer (the job's), else the innermost."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "/torch/" not in f.filename and "/dpeer/trainer/" not in f.filename]
    where = (own or frames)[-1:] if frames else []
    return f" ({where[0].filename}, line {where[0].lineno}, in {where[0].name})" if where else ""


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


def fetch(dataset: Any, collate: Callable[[list[Any]], Any], indices: list[int], where: str) -> Any:
    """``collate([dataset[i] for i in indices])``; an exception becomes a FeedError of one line that
    names the micro-batch, the sample or the collate, and the job's file and line (a DataLoader's worker
    process would otherwise pass on torch's many-line wrapper, which names none of them)."""
    samples = []
    for i in indices:
        try:
            samples.append(dataset[i])
        except Exception as exc:  # noqa: BLE001 - said in one line; the original is chained
            hint = (f": __getitem__ must serve every index below len(dataset), {len(dataset)}"
                    if isinstance(exc, IndexError) else "")
            raise FeedError(f"{where}: dataset[{i}] raised {_said(exc)}{_origin(exc)}{hint}") from exc
    try:
        return collate(samples)
    except Exception as exc:  # noqa: BLE001 - said in one line; the original is chained
        shapes = [structure(s) for s in samples]
        odd = next((n for n, s in enumerate(shapes) if s != shapes[0]), None)
        if odd is not None:
            raise FeedError(f"{where}: dataset[{indices[odd]}] is {shapes[odd]} but dataset[{indices[0]}] is "
                            f"{shapes[0]}: every sample must have one structure (types, keys, dtypes)") from exc
        raise FeedError(f"{where}: the collate_fn raised {_said(exc)}{_origin(exc)}") from exc


_WRAPPED = "\nOriginal Traceback (most recent call last):"


def _unwrapped(exc: BaseException, step: int) -> BaseException:
    """A DataLoader worker's exception, which torch re-raises with the worker's whole traceback in its
    message, as one line (its last: the exception the worker raised): a log keeps a traceback whole
    only when its message is one line."""
    text = str(exc)
    if _WRAPPED not in text:
        return exc
    last = text.rstrip().rsplit("\n", 1)[-1]
    prefix = f"{FeedError.__module__}.{FeedError.__qualname__}: "
    if last.startswith(prefix):
        return FeedError(last[len(prefix):])
    return FeedError(f"step {step}: {text.split(chr(10), 1)[0]} {last}")


class LoaderFeed:
    """A job's DataLoader settings over this rank's micro-batches (see the module)."""

    def __init__(self, loader: DataLoader, micro_batch: int, seed: int, dataset: Any = None) -> None:
        """``dataset``: what the loader's workers fetch from instead of ``loader.dataset`` (a stream's
        StreamReader)."""
        check_loader(loader, micro_batch)
        self.dataset = loader.dataset if dataset is None else dataset
        self.current: tuple[int, int, list[int]] | None = None  # the last micro-batch handed out: step, j, indices
        self._keys = _Keys(seed)
        extra: dict[str, Any] = {}
        if loader.num_workers > 0:
            extra = {"prefetch_factor": loader.prefetch_factor, "persistent_workers": loader.persistent_workers}
        self._loader = DataLoader(
            _Keyed(self.dataset), batch_sampler=self._keys,
            collate_fn=_SeededCollate(self.dataset, loader.collate_fn), num_workers=loader.num_workers,
            pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context, pin_memory_device=loader.pin_memory_device,
            generator=torch.Generator(), **extra)  # its own generator: a restart draws nothing from the step's stream
        self._it: Iterator[Any] | None = None
        self._cache: dict[tuple[int, int], Any] = {}
        self._shape: Any = None

    def replan(self, plan: Plan) -> None:
        """This rank's micro-batches changed (a new group, a heal): fetch ahead by ``plan`` from now on."""
        self._keys.plan = plan
        self._it = None
        self._cache.clear()  # fetched for the old plan: a micro-batch's id names other samples in another world (fast)

    def get(self, step: int, j: int, indices: list[int]) -> Any:
        """Micro-batch ``j`` of ``step``: the one the loader fetched ahead, or, when the loop went
        elsewhere (a redone or healed step), from a restarted fetch."""
        self.current = (step, j, indices)
        if (step, j) in self._cache:
            return self._cache[(step, j)]
        if self._cache and next(iter(self._cache))[0] != step:
            self._cache.clear()
        key, batch = self._next(step)
        if key[0] != step or key[1] > j:
            self._restart(step)
            key, batch = self._next(step)
        while key[0] == step and key != (step, j) and key[1] < j:  # ones before j (cached before a restart)
            key, batch = self._next(step)
        if key != (step, j):
            raise FeedError(f"the data loader gave micro-batch {key} where step {step} needs micro-batch {j}")
        self._check(step, j, batch)
        self._cache[key] = batch
        return batch

    def _next(self, step: int) -> tuple[tuple[int, int], Any]:
        if self._it is None:
            self._restart(step)
        assert self._it is not None
        try:
            return next(self._it)
        except BaseException as exc:
            self._it = None  # a worker that died or hung: the next fetch starts afresh
            one = _unwrapped(exc, step)
            if one is exc:
                raise
            raise one from None

    def _restart(self, step: int) -> None:
        self._keys.start = step
        self._it = iter(self._loader)

    def _check(self, step: int, j: int, batch: Any) -> None:
        shape = structure(batch)
        if self._shape is None:
            self._shape = shape
        elif shape != self._shape:
            raise FeedError(f"step {step} micro-batch {j}: the data loader's batch is {shape}, but the first "
                            f"was {self._shape}: every batch must have one structure (types, keys, dtypes)")

    def close(self) -> None:
        """Stop the loader's worker processes."""
        self._it = None


def check_loader(loader: Any, micro_batch: int) -> None:
    """Refuse a loader the runtime cannot feed exactly once per sample, in one sentence."""
    if not isinstance(loader, DataLoader):
        raise FeedError(f"run.steps() takes a torch.utils.data.DataLoader, got {type(loader).__name__}")
    if loader.batch_size != micro_batch:
        raise FeedError(f"the DataLoader's batch_size is {loader.batch_size} but training.micro_batch is "
                        f"{micro_batch}: the runtime decides which samples each micro-batch holds (its sampler, "
                        f"shuffle and batch_sampler are not used), so build it with batch_size=run.micro_batch")
