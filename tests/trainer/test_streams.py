"""Iterable datasets and parallel streams in one process (issue 36): which items a step holds, how a
stream is read at positions (seek, shards, read-and-discard, loader workers that shard by worker),
what a stream that ends early says, and a carried state's rows across a redo and a world change."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dpeer.trainer.audit import audit
from dpeer.trainer.carry import Carried, CarryUsageError
from dpeer.trainer.feed import FeedError, LoaderFeed
from dpeer.trainer.sampler import InOrderSampler, StreamsSampler, micro_batch_slice, shard_bounds
from dpeer.trainer.stream import ShardedStream, StreamReader
from tests.support.gloo import init_gloo

B, MB = 8, 2


class Counting(IterableDataset):
    """Items 0..n-1 (plus 1000 * epoch), as (tensor, int); a worker-sharding one yields only its
    worker's share, as torch's docs teach; ``seekable`` adds seek()."""

    def __init__(self, n: int = 20, by_worker: bool = False, sized: bool = True) -> None:
        self.n, self.by_worker, self.sized, self.epoch, self.start, self.opened = n, by_worker, sized, 0, 0, 0

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("no length")
        return self.n

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        self.opened += 1
        info = get_worker_info()
        for i in range(self.start, self.n):
            if self.by_worker and info is not None and i % info.num_workers != info.id:
                continue
            yield torch.tensor([float(i + 1000 * self.epoch)]), i + 1000 * self.epoch


class Seekable(Counting):
    def seek(self, position: int) -> None:
        self.start = position


def reader(ds, n: int | None = None, steps: int = 10) -> StreamReader:
    length = n if n is not None else (len(ds) if ds.sized else steps * B)
    sampler = InOrderSampler(length, B)
    return StreamReader(ds, length, sampler, type(ds).__name__, ds.sized)


def exact_plan(sampler, rank: int, world: int):
    def plan(step: int):
        first, end = shard_bounds(B // MB, rank, world)
        ix = sampler.indices_for_step(step)
        return [(j, micro_batch_slice(ix, MB, j)) for j in range(first, end)]
    return plan


def labels(f: LoaderFeed, plan, steps) -> list[int]:
    return [int(v) for s in steps for j, ix in plan(s) for v in f.get(s, j, ix)[1]]


def test_in_order_and_streams_samplers_pass_the_audit_shape() -> None:
    s = InOrderSampler(20, B)
    assert s.indices_for_step(2) == [16, 17, 18, 19, 0, 1, 2, 3]
    assert [s.position(2, i) for i in s.indices_for_step(2)] == list(range(16, 24))
    t = StreamsSampler(35, 4)  # L = 8 windows a stream; 3 left over
    assert t.stream_length == 8 and t.dataset_len == 32
    assert t.indices_for_step(9) == [1, 9, 17, 25] and [t.stream_of(i) for i in t.indices_for_step(9)] == [0, 1, 2, 3]
    assert t.epoch_starts(8) and not t.epoch_starts(9)
    with pytest.raises(ValueError, match="read an item twice"):
        InOrderSampler(4, B)
    ledger = [{"kind": "trained", "step": k, "gen": 1, "world": 1, "rank": 0, "micro_batches": [0, 1],
               "indices": t.indices_for_step(k)} for k in range(16)]
    assert isinstance(audit({"n1": ledger}, 0, t, 2), list)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["plain", "seekable", "by_worker", "unsized"])
def test_a_stream_is_read_at_its_positions_on_every_rank_and_worker(kind: str, workers: int) -> None:
    """Two ranks' micro-batches of steps 0..5 (three epochs of 20 items) together are the stream in
    order, each epoch's items once; a dataset that shards by worker still gives the whole stream."""
    ds = {"plain": Counting(), "seekable": Seekable(), "by_worker": Counting(by_worker=True),
          "unsized": Counting(n=60, sized=False)}[kind]
    rd = reader(ds, steps=6)
    got = []
    for rank in range(2):
        f = LoaderFeed(DataLoader(ds, batch_size=MB, num_workers=workers), MB, seed=1, dataset=rd)
        plan = exact_plan(rd.sampler, rank, 2)
        f.replan(plan)
        got.append(labels(f, plan, range(6)))
        f.close()
    expected = [p % 20 + 1000 * (p // 20) if kind != "unsized" else p for p in range(48)]
    mine = [[expected[s * B + half + k] for s in range(6) for k in range(4)] for half in (0, 4)]
    assert got == mine


def test_a_resumed_rank_reads_from_its_step_and_a_seekable_stream_discards_nothing() -> None:
    plain, seek = reader(Counting()), reader(Seekable())
    for rd in (plain, seek):
        f = LoaderFeed(DataLoader(rd.stream, batch_size=MB), MB, seed=1, dataset=rd)
        plan = exact_plan(rd.sampler, 1, 2)
        f.replan(plan)
        assert labels(f, plan, [1]) == [12, 13, 14, 15]  # step 1, rank 1 of 2: positions 12..15
        f.close()
    assert plain.discarded == 12 and seek.discarded == 0


@pytest.mark.parametrize("workers", [0, 1])
def test_a_stream_shorter_than_its_length_is_one_line_naming_it(workers: int) -> None:
    class Short(Counting):
        def __len__(self) -> int:
            return 30  # says 30, yields 20
    rd = reader(Short(), n=30)
    f = LoaderFeed(DataLoader(rd.stream, batch_size=MB, num_workers=workers), MB, seed=1, dataset=rd)
    plan = exact_plan(rd.sampler, 0, 1)
    f.replan(plan)
    labels(f, plan, [0, 1])
    with pytest.raises(FeedError) as caught:
        labels(f, plan, [2])
    text = str(caught.value)
    assert "\n" not in text and "the stream Short ended after 20 items of epoch 0, but its len() is 30" in text, text
    f.close()


def test_an_unsized_stream_that_ends_before_the_run_says_what_the_run_needs() -> None:
    rd = reader(Counting(n=10, sized=False), steps=3)
    f = LoaderFeed(DataLoader(rd.stream, batch_size=MB), MB, seed=1, dataset=rd)
    plan = exact_plan(rd.sampler, 0, 1)
    f.replan(plan)
    with pytest.raises(FeedError, match="ended after 10 items, but the run's steps need 24"):
        labels(f, plan, [0, 1])
    f.close()


def test_a_sharded_stream_seeks_into_its_shard_in_the_epochs_order() -> None:
    opened: list[int] = []

    def open_shard(k: int):
        opened.append(k)
        return [(k, i) for i in range(5)]

    ds = ShardedStream([5, 5, 5, 5], open_shard, order=lambda e: [3, 2, 1, 0] if e % 2 else [0, 1, 2, 3])
    ds.set_epoch(1)
    ds.seek(7)
    assert list(ds)[:4] == [(2, 2), (2, 3), (2, 4), (1, 0)] and opened[0] == 2
    rd = StreamReader(ds, 20, InOrderSampler(20, B), "ShardedStream", True)
    assert [rd[p] for p in (21, 39, 40)] == [(3, 1), (0, 4), (0, 0)] and rd.discarded == 0


@pytest.fixture()
def group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    init_gloo(0, 1)
    yield
    dist.destroy_process_group()


def fake_trainer(sampler: StreamsSampler, step: int):
    return SimpleNamespace(sampler=sampler, step=step, feed=SimpleNamespace(current=None),
                           spec=SimpleNamespace(global_batch=sampler.global_batch))


def test_carried_rows_read_the_steps_start_on_a_replay_and_commit_only_when_shared(group) -> None:
    sampler = StreamsSampler(16, 4)  # L = 4
    h = Carried(torch.zeros(4, 2))
    t = fake_trainer(sampler, 1)
    h.bind(t, "hidden")

    def run_step(step: int, passes: int = 1, share: bool = True) -> list[torch.Tensor]:
        t.step = step
        h._clear(step)
        seen = []
        for _ in range(passes):  # exact mode's replay runs the micro-batches again
            for j in range(2):
                ix = micro_batch_slice(sampler.indices_for_step(step), 2, j)
                t.feed.current = (step, j, ix)
                old = h.read()
                seen.append(old)
                h.write(old + torch.tensor([[float(r), -0.0] for r in h.rows()]) + 1)
        if share:
            h.share([0, 1, 2, 3])
            h.commit(step)
        return seen

    first = run_step(1, passes=2)
    assert torch.equal(first[0], first[2]) and torch.equal(first[1], first[3]), "the replay reads the step's start"
    assert h.value[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert not torch.signbit(h.value).any(), "-0.0 is +0.0 on every world size"
    run_step(2, share=False)  # a failed try: nothing committed
    assert h.value[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    run_step(2)
    assert h.value[:, 0].tolist() == [2.0, 4.0, 6.0, 8.0]
    assert run_step(4)[0].abs().sum() == 0, "an epoch's first step starts every stream afresh"
    saved = {k: v.clone() for k, v in h.state_dict().items()}
    other = Carried(torch.zeros(4, 2))
    other.load_state_dict(saved)
    assert torch.equal(other.value, h.value)


def test_carried_refuses_a_micro_batch_left_unwritten_and_a_wrong_order(group) -> None:
    sampler = StreamsSampler(16, 4)
    h = Carried(torch.zeros(4, 2))
    t = fake_trainer(sampler, 0)
    h.bind(t, "hidden")
    h._clear(0)
    t.feed.current = (0, 0, micro_batch_slice(sampler.indices_for_step(0), 2, 0))
    h.write(h.read() + 1)
    with pytest.raises(CarryUsageError, match=r"hidden.write\(\) was not called for stream\(s\) \[2, 3\]"):
        h.share([0, 1, 2, 3])
    with pytest.raises(CarryUsageError, match="order='streams'"):
        Carried(torch.zeros(4, 2)).bind(SimpleNamespace(sampler=InOrderSampler(16, 4)), "hidden")


class Noisy(Counting):
    def __iter__(self):
        for x, y in super().__iter__():
            yield x + torch.rand(1), y


def test_an_items_random_draws_are_the_same_whether_read_or_discarded_by_any_worker() -> None:
    """One rank with no workers, and two ranks with two workers each (which read and discard the
    others' items): every item draws the same augmentation."""
    def items(world: int, workers: int) -> list[float]:
        rd = reader(Noisy(by_worker=True))
        out = []
        for rank in range(world):
            f = LoaderFeed(DataLoader(rd.stream, batch_size=MB, num_workers=workers), MB, seed=1, dataset=rd)
            plan = exact_plan(rd.sampler, rank, world)
            f.replan(plan)
            out += [float(v) for s in range(3) for j, ix in plan(s) for v in f.get(s, j, ix)[0].flatten()]
            f.close()
        return out
    one, two = items(1, 0), items(2, 2)
    assert sorted(one) == sorted(two) and len(set(one)) == len(one)
