import itertools

import pytest

from dpeer.trainer.sampler import (
    FeistelPermutation,
    GlobalBatchSampler,
    micro_batches,
    shard,
    shard_bounds,
    share_counts,
)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 100, 1000, 4097])
@pytest.mark.parametrize("key", [0, 1, 12345])
def test_feistel_is_a_permutation(n, key):
    perm = FeistelPermutation(n, key)
    assert sorted(perm(i) for i in range(n)) == list(range(n))


def test_permutation_depends_on_key():
    a = [FeistelPermutation(1000, 1)(i) for i in range(1000)]
    b = [FeistelPermutation(1000, 2)(i) for i in range(1000)]
    assert a != b


@pytest.mark.parametrize(
    "dataset_len,batch,steps",
    [(100, 10, 10), (100, 7, 30), (64, 64, 3), (10, 3, 20), (1, 1, 4)],
)
def test_each_epoch_covers_dataset_exactly_once(dataset_len, batch, steps):
    s = GlobalBatchSampler(dataset_len, batch, seed=7)
    stream = [i for st in range(steps) for i in s.indices_for_step(st)]
    for e in range(len(stream) // dataset_len):
        assert sorted(stream[e * dataset_len : (e + 1) * dataset_len]) == list(range(dataset_len))
    assert all(len(s.indices_for_step(st)) == batch for st in range(steps))


def test_indices_are_deterministic_and_seeded():
    a = GlobalBatchSampler(1000, 32, seed=1)
    b = GlobalBatchSampler(1000, 32, seed=1)
    c = GlobalBatchSampler(1000, 32, seed=2)
    assert a.indices_for_step(5) == b.indices_for_step(5)
    assert a.indices_for_step(5) != c.indices_for_step(5)
    assert a.indices_for_step(0) != a.indices_for_step(1)
    assert a.cursor_after(3) == 96


def test_the_stream_is_the_one_earlier_releases_drew() -> None:
    """Pinned outputs: a run resumed by a newer dpeer (or audited by one) must draw the very
    samples the older one did, so a rewrite of the permutation for speed may not change them."""
    s = GlobalBatchSampler(40960, 16, 7)
    assert s.indices_for_step(0) == [2167, 12285, 10665, 31829, 27176, 16264, 21639, 13851,
                                     23, 12610, 23920, 37889, 4273, 22086, 11363, 25822]
    assert s.indices_for_step(2559)[:4] == [6373, 6546, 16418, 29740]
    assert GlobalBatchSampler(1000, 7, 3).indices_for_step(142) == [947, 161, 628, 148, 237, 881, 404]


@pytest.mark.parametrize("batch", [1, 2, 7, 16, 33])
def test_shards_partition_any_world(batch):
    indices = GlobalBatchSampler(500, batch, seed=3).indices_for_step(2)
    for world in range(1, batch + 1):
        parts = [shard(indices, r, world) for r in range(world)]
        assert [i for p in parts for i in p] == indices
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1
        assert sum(sizes) == batch


@pytest.mark.parametrize(
    "total,rank,world,expected",
    [(10, 0, 3, (0, 4)), (10, 1, 3, (4, 7)), (10, 2, 3, (7, 10)), (2, 2, 3, (2, 2)), (0, 0, 1, (0, 0))],
)
def test_shard_bounds_table(total, rank, world, expected):
    assert shard_bounds(total, rank, world) == expected


@pytest.mark.parametrize("bad", [(0, 0), (1, 1), (-1, 2)])
def test_shard_rejects_bad_rank(bad):
    rank, world = bad
    with pytest.raises(ValueError):
        shard([1, 2, 3], rank, world)


@pytest.mark.parametrize(
    "n,mb,expected_sizes",
    [(10, 4, [4, 4, 2]), (8, 4, [4, 4]), (3, 8, [3]), (0, 2, [])],
)
def test_micro_batches(n, mb, expected_sizes):
    items = list(range(n))
    parts = micro_batches(items, mb)
    assert [len(p) for p in parts] == expected_sizes
    assert [i for p in parts for i in p] == items


def test_shares_split_a_step_by_weight_and_equal_weights_split_evenly() -> None:
    for total in range(0, 50):
        for world in range(1, 6):
            for weights in ([3] * world, [1 + r % 3 for r in range(world)], [64] + [1] * (world - 1)):
                counts = share_counts(total, weights)
                assert sum(counts) == total and len(counts) == world
                exact = [total * w / sum(weights) for w in weights]
                if total >= world:
                    assert min(counts) >= 1, (total, weights, counts)  # every box keeps being measured
                if total < world or min(exact) >= 1:  # no rank lifted to its one item: within 1 of the exact share
                    assert all(abs(c - e) < 1 for c, e in zip(counts, exact)), (total, weights, counts)
                assert all(counts[a] >= counts[b] for a in range(world) for b in range(world)
                           if weights[a] > weights[b]), (total, weights, counts)
                bounds = [shard_bounds(total, r, world, weights) for r in range(world)]
                assert bounds[0][0] == 0 and bounds[-1][1] == total
                assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])), "contiguous, in rank order"
            assert [shard_bounds(total, r, world, [3] * world) for r in range(world)] == \
                   [shard_bounds(total, r, world) for r in range(world)]
    assert share_counts(8, [8, 4]) == [5, 3] and share_counts(2, [1, 8, 8]) == [0, 1, 1]


def test_a_much_slower_box_keeps_one_micro_batch_while_there_are_enough() -> None:
    """Two boxes whose classes are 8 apart (a box measured slow on a busy machine): the slow one
    still runs a micro-batch of two, so its speed is measured again and its share can grow back."""
    assert share_counts(2, [8, 2]) == [1, 1]
    assert share_counts(3, [8, 1, 1]) == [1, 1, 1]
    assert share_counts(10, [64, 1, 1]) == [8, 1, 1]
    assert share_counts(9, [8, 1]) == [8, 1]


def test_a_rank_lifted_to_one_item_takes_it_from_the_lightest_of_those_with_the_most() -> None:
    """The floor of one item takes it from a rank with the most; of several, the one of the least
    weight: a heavier (faster) rank never ends with fewer items than a lighter one. (8, 7, 1) is
    plan_shares of classes 0, -1 and -12; 4 micro-batches, the default 64 / 16, split 2/2/0 before
    the floor, and taking rank 0's left the fastest box 1 against the slower one's 2."""
    assert share_counts(4, [8, 7, 1]) == [2, 1, 1]
    assert share_counts(4, [5, 4, 1]) == [2, 1, 1]
    assert share_counts(4, [1, 7, 8]) == [1, 1, 2]
    assert share_counts(4, [8, 8, 1]) == [2, 1, 1]  # equal weights: the lower rank keeps the more, as even
    for world in range(2, 7):
        for weights in itertools.product(range(1, 9), repeat=world) if world <= 3 else (
                [1 + (r * 5 + world) % 8 for r in range(world)], [8] * (world - 1) + [1], [1] + [8] * (world - 1)):
            for total in range(world, 3 * world + 3):
                counts = share_counts(total, list(weights))
                assert all(counts[a] >= counts[b] for a in range(world) for b in range(world)
                           if weights[a] > weights[b]), (total, weights, counts)


@pytest.mark.parametrize("shares", [[0, 1], [1, -2], [1.5, 1], [], [True, 1]])
def test_shares_that_are_not_positive_integers_are_refused(shares: list) -> None:
    with pytest.raises(ValueError):
        share_counts(8, shares)


def test_shares_of_another_world_are_refused() -> None:
    with pytest.raises(ValueError):
        shard_bounds(8, 0, 3, [1, 2])
