"""The sharded exact sum (exact_shards.py): a step where every rank runs at most one micro-batch is
summed by owners of the buckets' shards, and ends with the same bits as the allreduce path (a
1-rank group, every micro-batch on one rank) and as every other world size, step after step: the
first step's measuring pass, a model of more overlap buckets than the owners' pool has slots (so
slots are reused within a step) whose rows do not split evenly over 3 ranks, a rank with no
micro-batch, dropout and BatchNorm; the owners' buffers stay far below a copy of the model; and a NaN
raises on every rank."""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dpeer.trainer import exact_sums, overlap
from dpeer.trainer.exact import ExactStep, NonFiniteGradient
from dpeer.trainer.exact_shards import SLOTS, ShardedSum
from dpeer.trainer.sampler import share_counts
from dpeer.trainer.state import tensor_bytes
from tests.support.exact import demo, run_step, stepper
from tests.support.gloo import init_gloo

MICRO = 2  # micro-batches a step
STEPS = 4
SMALL_BUCKETS = 16 * 1024 * 8  # bytes of a float64 bucket of 16 rows: the 1101 rows of dim 64 / hidden 1024 in 69 buckets


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(tensor_bytes(t.detach()))
    return h.hexdigest()[:16]


def _owners(step: ExactStep) -> ShardedSum | None:
    """The owners' exchanges of the step's group (exact_shards.ShardedSum; None unless sharded)."""
    return None if step._sums is None else getattr(step._sums.path, "owners", None)


def _held_bytes(step: ExactStep) -> int:
    """Bytes of the tensors the step's ShardedSum holds, less the gradient row and the control slots
    (ExactStep's, which it writes into)."""
    shared = {step.row.untyped_storage().data_ptr(), step._sums.control.buf.untyped_storage().data_ptr()}
    seen: dict[int, int] = {}

    def walk(value: object) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if storage.data_ptr() not in shared:
                seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            walk(list(value.values()))

    walk(list(vars(_owners(step)).values()))
    return sum(seen.values())


def _train(rank: int, world: int, store: str, out: str, options: dict, nan_at: int, bucket_bytes: int,
           shares: tuple[int, ...] | list[tuple[int, ...]] = (), micro: int = MICRO) -> None:
    """One rank: STEPS steps of the demo (``micro`` micro-batches a step, split by ``shares``, or by
    ``shares[s]`` at step s when it is a list, as views that change the shares do; in overlap
    buckets of ``bucket_bytes``, 0: the default), each step's gradient and parameter digests, and
    the owners' buffer bytes, to ``out``."""
    torch.set_num_threads(1)
    if bucket_bytes:
        exact_sums.plan_buckets = functools.partial(overlap.plan_buckets, first_bytes=bucket_bytes, bucket_bytes=bucket_bytes)
    init_gloo(rank, world, init_method=f"file://{store}")
    spec = demo(global_batch=4 * micro, **options)
    step = stepper(spec)
    rows, sharded = [], []
    try:
        for s in range(STEPS):
            if s == nan_at:
                with torch.no_grad():
                    next(spec.model.parameters())[0].fill_(float("nan"))
            step.plan(s, rank, world, shares[s] if isinstance(shares, list) else shares)
            sharded.append(step._sharded)
            try:
                run_step(step, rank, world)
            except NonFiniteGradient as exc:
                rows.append({"error": str(exc)})
                break
            params = list(spec.model.parameters())
            rows.append({"grads": _digest([p.grad for p in params]), "buffers": _digest(list(spec.model.buffers())),
                         "loss_ok": True})
            spec.optimizer.step()
            rows.append({"params": _digest(params)})
        held = _held_bytes(step) if _owners(step) is not None else 0
        Path(out).write_text(json.dumps({"rows": rows, "sharded": sharded, "redos": step.redos, "held": held,
                                         "row": step.row.nbytes, "buckets": len(step._sums.plan), "mine": step._mine}))
    finally:
        dist.destroy_process_group()


def _run(tmp_path: Path, world: int, options: dict, nan_at: int = -1, bucket_bytes: int = 0,
         shares: tuple[int, ...] | list[tuple[int, ...]] = (), micro: int = MICRO) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    name = f"w{world}-{abs(hash(str(shares)))}"
    store = tmp_path / f"store-{name}"
    outs = [tmp_path / f"{name}-r{r}.json" for r in range(world)]
    procs = [ctx.Process(target=_train, args=(r, world, str(store), str(outs[r]), options, nan_at, bucket_bytes,
                                              shares, micro))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0, f"a rank of world {world} failed (exit code {p.exitcode})"
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("options", "bucket_bytes"), [({"dim": 64, "hidden": 1024}, SMALL_BUCKETS),
                                                       ({"dropout": 0.3, "norm": "batch"}, 0)],
                         ids=["many-buckets", "dropout-batchnorm"])
def test_owners_sums_give_the_allreduce_paths_bits_in_every_world_size(tmp_path: Path, options: dict,
                                                                         bucket_bytes: int) -> None:
    solo = _run(tmp_path, 1, options, bucket_bytes=bucket_bytes)[0]
    assert solo["sharded"] == [False] * STEPS and solo["redos"] == 1
    for world in (2, 3):
        ranks = _run(tmp_path, world, options, bucket_bytes=bucket_bytes)
        for r in ranks:
            assert r["sharded"] == [True] * STEPS, "a step with at most one micro-batch a rank is summed by owners"
            assert r["redos"] == 1, "the first step measures, then sums with the measured exponents"
            assert r["rows"] == solo["rows"], f"world {world} differs from the 1-rank allreduce path"
            if bucket_bytes:
                # SLOTS buckets' float32 (each under 17 of the row's 1101 rows) and a chunk's float64
                # scratch: under a third of the row, where keeping every bucket's exchanges took two rows
                assert r["buckets"] > SLOTS and r["held"] < r["row"] / 3, r


@pytest.mark.timeout(600)
def test_a_nan_gradient_raises_on_every_rank_of_a_sharded_step(tmp_path: Path) -> None:
    ranks = _run(tmp_path, 2, {}, nan_at=2)
    for r in ranks:
        assert "error" in r["rows"][-1], r["rows"][-1]
        assert "is NaN or Inf" in r["rows"][-1]["error"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("micro", "shares", "sharded"), [(6, (8, 4, 2), False), (2, (1, 8, 8), True)],
                         ids=["allreduce-3-2-1", "owners-0-1-1"])
def test_uneven_shares_give_the_1_rank_runs_bits(tmp_path: Path, micro: int, shares: tuple[int, ...],
                                                 sharded: bool) -> None:
    """A view's shares (a slow box's smaller part of a step) change who runs which micro-batch, not
    the sums: each step ends with the 1-rank run's bits."""
    options = {"dropout": 0.3, "norm": "batch"}
    solo = _run(tmp_path, 1, options, micro=micro)[0]
    ranks = _run(tmp_path, 3, options, shares=shares, micro=micro)
    for r in ranks:
        assert r["sharded"] == [sharded] * STEPS
        assert len(r["mine"]) == share_counts(micro, shares)[ranks.index(r)]
        assert r["rows"] == solo["rows"], f"shares {shares} differ from the 1-rank run"


@pytest.mark.timeout(600)
def test_shares_that_move_a_group_between_its_sum_paths_keep_the_1_rank_runs_bits(tmp_path: Path) -> None:
    """Views whose shares change while the group keeps its size (3) move it between the owners' path
    (1/1/0, and 0/1/1) and the allreduce (2/0/0): each step must take the path its own split needs
    (the group's sums were kept by size alone, so a 2/0/0 step ran on the owners' path and left
    the fault-free run's bits; found by the chaos smoke run)."""
    schedule = [(), (8, 1, 1), (1, 8, 8), (8, 1, 1)]
    assert len(schedule) == STEPS
    solo = _run(tmp_path, 1, {}, micro=2)[0]
    ranks = _run(tmp_path, 3, {}, shares=schedule, micro=2)
    for r in ranks:
        assert r["sharded"] == [True, False, True, False]
        assert r["rows"] == solo["rows"], "a change of path within one group size left the 1-rank run's bits"
