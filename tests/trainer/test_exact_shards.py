"""The sharded exact sum (exact_shards.py): a step where every rank runs at most one micro-batch is
summed by owners of the buckets' shards, and ends with the same bits as the allreduce path (a
1-rank group, every micro-batch on one rank) and as every other world size, step after step: the
first step's measuring pass, a model of several overlap buckets whose rows do not split evenly over
3 ranks (padding), a rank with no micro-batch, dropout and BatchNorm; and a NaN raises on every rank."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dpeer.trainer.exact import NonFiniteGradient
from dpeer.trainer.state import tensor_bytes
from tests.support.exact import demo, run_step, stepper

MICRO = 2  # micro-batches a step
STEPS = 4


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(tensor_bytes(t.detach()))
    return h.hexdigest()[:16]


def _train(rank: int, world: int, store: str, out: str, options: dict, nan_at: int) -> None:
    """One rank: STEPS steps of the demo, each step's gradient and parameter digests to ``out``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    spec = demo(global_batch=4 * MICRO, **options)
    step = stepper(spec)
    rows, sharded = [], []
    try:
        for s in range(STEPS):
            if s == nan_at:
                with torch.no_grad():
                    next(spec.model.parameters())[0].fill_(float("nan"))
            step.plan(s, rank, world)
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
        Path(out).write_text(json.dumps({"rows": rows, "sharded": sharded, "redos": step.redos}))
    finally:
        dist.destroy_process_group()


def _run(tmp_path: Path, world: int, options: dict, nan_at: int = -1) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    store = tmp_path / f"store-{world}"
    outs = [tmp_path / f"w{world}-r{r}.json" for r in range(world)]
    procs = [ctx.Process(target=_train, args=(r, world, str(store), str(outs[r]), options, nan_at))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0, f"a rank of world {world} failed (exit code {p.exitcode})"
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("options", [{"dim": 64, "hidden": 1024}, {"dropout": 0.3, "norm": "batch"}],
                         ids=["several-buckets", "dropout-batchnorm"])
def test_owners_sums_give_the_allreduce_paths_bits_in_every_world_size(tmp_path: Path, options: dict) -> None:
    solo = _run(tmp_path, 1, options)[0]
    assert solo["sharded"] == [False] * STEPS and solo["redos"] == 1
    for world in (2, 3):
        ranks = _run(tmp_path, world, options)
        for r in ranks:
            assert r["sharded"] == [True] * STEPS, "a step with at most one micro-batch a rank is summed by owners"
            assert r["redos"] == 1, "the first step measures, then sums with the measured exponents"
            assert r["rows"] == solo["rows"], f"world {world} differs from the 1-rank allreduce path"


@pytest.mark.timeout(600)
def test_a_nan_gradient_raises_on_every_rank_of_a_sharded_step(tmp_path: Path) -> None:
    ranks = _run(tmp_path, 2, {}, nan_at=2)
    for r in ranks:
        assert "error" in r["rows"][-1], r["rows"][-1]
        assert "is NaN or Inf" in r["rows"][-1]["error"]
