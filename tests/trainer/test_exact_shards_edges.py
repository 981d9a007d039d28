"""The sharded exact sum (exact_shards.py) at its edges, against the allreduce path of a 1-rank group:
models of 1, 4, 5, 8 and 9 overlap buckets (below, at and above LAG and SLOTS), buckets of fewer rows
than ranks (owners of empty shards) and shards of more rows than a conversion chunk, a layer that
gets no gradient (it holds the launches back until backward returns) and one that only some
micro-batches use, a rank with no micro-batch (3 ranks, 2 micro-batches), a redo in the middle of
the run (the loss scaled far past the exponents' headroom), a bfloat16 model (every gradient loose,
nothing overlapped), a float64 model (not sharded), an Inf gradient; and a step that fails half-way
(the job's code raising on one rank after its buckets left, in the first pass or in the one that
sums again, a peer that dies), after which the same steppers in a new group end with the
fault-free bits instead of hanging or summing stale slots."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import multiprocessing
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dpeer.trainer import exact_sums, overlap
from dpeer.trainer.demo import SyntheticDataset, collate
from dpeer.trainer.exact import ExactStep, NonFiniteGradient
from dpeer.trainer.exact_shards import LAG, SLOTS, ShardedSum
from dpeer.trainer.feed import InlineFeed
from dpeer.trainer.group import GroupError
from dpeer.trainer.job_api import TrainSpec
from dpeer.trainer.sampler import GlobalBatchSampler
from dpeer.trainer.state import tensor_bytes
from tests.support.gloo import init_gloo

CPU = torch.device("cpu")
MICRO = 2  # micro-batches a step: at 3 ranks one rank has none
STEPS = 5
LOUD = 3  # the step whose loss is scaled by 1e6: its gradients outgrow the exponents, a redo
DIM, CLASSES = 16, 4
# name: gradient rows (1024 elements), rows of the first bucket and of the others, buckets, dtype
CONFIGS = {"b1": (3, 3, 3, 1, torch.float32), "b4": (7, 1, 2, 4, torch.float32),
           "b5": (5, 1, 1, 5, torch.float32), "b8": (15, 1, 2, 8, torch.float32),
           "b9": (25, 1, 3, 9, torch.float32), "f64": (5, 1, 1, 5, torch.float64),
           "chunks": (700, 128, 512, 3, torch.float32),  # shards of more rows than a conversion chunk
           "bf16": (5, 1, 1, 5, torch.bfloat16)}  # every gradient loose (copied into the row): no overlap


class Net(torch.nn.Module):
    """Two layers and, between them in parameter order, one that forward never uses (its rows'
    bucket cannot launch before backward returns, so every later bucket waits behind it) and one
    that a micro-batch uses or not by a draw from its seeded stream (in a step where one rank's
    micro-batch uses it and another's does not, the ranks launch its bucket at different times)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(DIM, hidden)
        self.unused = torch.nn.Linear(4, 4)
        self.sometimes = torch.nn.Linear(DIM, CLASSES)
        self.fc2 = torch.nn.Linear(hidden, CLASSES)
        self.uses: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc2(torch.relu(self.fc1(x)))
        self.uses.append(bool(torch.rand(()) < 0.5))
        return out + self.sometimes(x) if self.uses[-1] else out


def _build(name: str) -> tuple[ExactStep, TrainSpec, list[float]]:
    """The config's stepper (its buckets of the config's rows), spec, and the loss scale a test sets."""
    rows, first, rest, _count, dtype = CONFIGS[name]
    exact_sums.plan_buckets = functools.partial(overlap.plan_buckets, first_bytes=first * 1024 * 8,
                                           bucket_bytes=rest * 1024 * 8)
    torch.manual_seed(7)
    model = Net((rows * 1024 - 300) // (DIM + 1 + CLASSES)).to(dtype)
    scale = [1.0]
    spec = TrainSpec(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     dataset=SyntheticDataset(64, DIM, CLASSES, 3, dtype),
                     loss_fn=lambda out, y: torch.nn.functional.cross_entropy(out, y, reduction="sum") * scale[0],
                     global_batch=4 * MICRO, micro_batch=4, steps=STEPS, seed=3, collate=collate)
    sampler = GlobalBatchSampler(len(spec.dataset), spec.global_batch, spec.seed)
    step = ExactStep(spec, list(model.parameters()), sampler, CPU, collate)
    assert step.nb == rows
    return step, spec, scale


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(tensor_bytes(t.detach()))
    return h.hexdigest()[:16]


def _owners(step: ExactStep) -> ShardedSum | None:
    """The owners' exchanges of the step's group (exact_shards.ShardedSum; None unless sharded)."""
    return None if step._sums is None else getattr(step._sums.path, "owners", None)


def _run_step(step: ExactStep, rank: int, world: int, after_backward=None) -> None:
    """The planned step's passes as the trainer runs them; ``after_backward(j)`` runs in the job's
    body after each micro-batch's backward (a failure the test plants)."""
    spec = step.spec
    feed = InlineFeed(spec.dataset, collate)
    step.begin()
    try:
        while True:
            for n, (j, indices) in enumerate(step.planned()):
                step.enter(n)
                x, y = feed.get(0, j, indices)
                step.backward(spec.loss_fn(spec.model(x), y))
                if after_backward is not None:
                    after_backward(j)
                step.leave(n)
            step.end_pass()
            if step.reduce(rank, world) is not None:
                return
    finally:
        step.abort()


def _train(step: ExactStep, spec: TrainSpec, scale: list[float], steps: range, rank: int, world: int,
           rows: list[dict]) -> None:
    """``steps`` of the run: each step's gradient digest, and the parameters' after the optimizer (not
    at LOUD, whose gradients are a million times too large to apply)."""
    for s in steps:
        scale[0] = 1e6 if s == LOUD else 1.0
        step.plan(s, rank, world)
        _run_step(step, rank, world)
        params = list(spec.model.parameters())
        rows.append({"step": s, "grads": _digest([p.grad for p in params]), "sharded": step._sharded})
        if s != LOUD:
            spec.optimizer.step()
            rows.append({"step": s, "params": _digest(params)})


def _init(store: str, rank: int, world: int) -> None:
    init_gloo(rank, world, init_method=f"file://{store}", timeout=dt.timedelta(seconds=60))
    dist.distributed_c10d._set_pg_timeout(dt.timedelta(seconds=3))  # a lost peer's collective raises soon


def _configs(rank: int, world: int, store: str, out: str) -> None:
    """Every config's run, then a run where one micro-batch's gradient is Inf at step 1."""
    torch.set_num_threads(1)
    _init(store, rank, world)
    result: dict = {}
    try:
        for name in CONFIGS:
            step, spec, scale = _build(name)
            rows: list[dict] = []
            _train(step, spec, scale, range(STEPS), rank, world, rows)
            result[name] = {"rows": rows, "redos": step.redos, "buckets": len(step._sums.plan), "uses": spec.model.uses}
            step.close()
        step, spec, scale = _build("b5")

        def infinite(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.cross_entropy(out, y, reduction="sum")
            return loss * float("inf") if step._mine == [1] or step._mine == [0, 1] and step._n == 1 else loss
        rows = []
        _train(step, spec, scale, range(1), rank, world, rows)
        spec.loss_fn = infinite
        try:
            _train(step, spec, scale, range(1, 2), rank, world, rows)
            result["inf"] = "summed"
        except NonFiniteGradient as exc:
            result["inf"] = str(exc)
            result["inf_busy"] = _owners(step) is not None and _owners(step).busy
        Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path: Path, target, world: int, *args: object) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    store = tmp_path / f"store-{target.__name__}-{world}"
    outs = [tmp_path / f"{target.__name__}-w{world}-r{r}.json" for r in range(world)]
    procs = [ctx.Process(target=target, args=(r, world, str(store), str(outs[r]), *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
    return [json.loads(o.read_text()) if o.exists() else {"exitcode": p.exitcode} for o, p in zip(outs, procs)]


@pytest.mark.timeout(300)
def test_owners_give_the_allreduce_bits_at_every_bucket_count_and_shard_size(tmp_path: Path) -> None:
    assert LAG < 5 < SLOTS < 9, "the configs' 1, 4, 5, 8 and 9 buckets lie below, at and above LAG and SLOTS"
    solo = _spawn(tmp_path, _configs, 1)[0]
    assert "exitcode" not in solo, solo
    for name, (*_, count, dtype) in CONFIGS.items():
        assert solo[name]["buckets"] == count and solo[name]["redos"] == 2, (name, solo[name])
        assert not any(r.get("sharded") for r in solo[name]["rows"])
    assert "is NaN or Inf" in solo["inf"]
    for world in (2, 3):
        ranks = _spawn(tmp_path, _configs, world)
        for r in ranks:
            assert "exitcode" not in r, f"a rank of world {world} failed: {r}"
            for name, (*_, dtype) in CONFIGS.items():
                sharded = [row["sharded"] for row in r[name]["rows"] if "sharded" in row]
                assert sharded == [dtype != torch.float64] * STEPS, (world, name, sharded)
                assert r[name]["redos"] == 2, "the first step and the loud one are summed again"
                assert r[name]["rows"] == [{**row, "sharded": row["sharded"] or dtype != torch.float64}
                                           if "sharded" in row else row for row in solo[name]["rows"]], (world, name)
            assert r["inf"] == solo["inf"], "every rank names the same parameter as the 1-rank group"
            assert r["inf_busy"] is False, "the Inf step's exchanges were all waited for"
        if world == 2:  # some pass had one rank's micro-batch use the layer and the other's not
            assert any(u0 != u1 for u0, u1 in zip(ranks[0]["b9"]["uses"], ranks[1]["b9"]["uses"]))


FAIL_AT = 2  # the step that fails half-way


def _fails(rank: int, world: int, store: str, out: str, mode: str) -> None:
    """The b9 config's run, where at FAIL_AT rank 1's job code fails after its backward (``raise``:
    an exception; ``die``: the process exits; ``redo``: an exception at LOUD, in the pass that sums
    again), its buckets up to the unused layer's sent. The others' collectives must raise, not hang;
    then the same steppers, in a new group (rank 0 alone after ``die``), redo the step and go on.
    ``none``: no failure."""
    torch.set_num_threads(1)
    _init(store, rank, world)
    step, spec, scale = _build("b9")
    rows: list[dict] = []
    result: dict = {"rows": rows}
    try:
        at = LOUD if mode == "redo" else FAIL_AT
        _train(step, spec, scale, range(at), rank, world, rows)
        if mode != "none":
            step.plan(at, rank, world)
            scale[0], before = 1e6 if at == LOUD else 1.0, step.redos

            def fail(_j: int) -> None:
                if rank == 1 and (mode != "redo" or step.redos > before):
                    launched = len(_owners(step)._first) + len(_owners(step)._second)
                    assert 0 < launched < len(step._sums.plan), "half-way: some buckets left, not all"
                    if mode == "die":
                        os._exit(3)
                    raise RuntimeError("the job's code failed after backward")
            try:
                _run_step(step, rank, world, fail)
                result["error"] = None
            except (RuntimeError, GroupError) as exc:
                result["error"] = type(exc).__name__
            result["busy"] = _owners(step).busy
            dist.destroy_process_group()
            if mode == "die":
                world = 1
            _init(f"{store}-again", rank, world)
        _train(step, spec, scale, range(at, STEPS), rank, world, rows)
        result["redos"] = step.redos
    finally:
        Path(out).write_text(json.dumps(result))
        dist.destroy_process_group()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["raise", "die", "redo"])
def test_a_step_that_fails_half_way_raises_and_the_next_group_sums_the_fault_free_bits(tmp_path: Path,
                                                                                       mode: str) -> None:
    reference = _spawn(tmp_path, _fails, 1, "none")[0]
    assert reference.get("redos") == 2, reference
    ranks = _spawn(tmp_path, _fails, 2, mode)
    survivors = ranks[:1] if mode == "die" else ranks
    if mode == "die":
        assert ranks[1] == {"exitcode": 3}, ranks[1]
    for r, got in enumerate(survivors):
        expected = "RuntimeError" if r == 1 else "GroupError"
        assert got["error"] == expected, f"rank {r}: {got}"
        assert got["busy"] is True, "the failure left exchanges in flight: the next step must not reuse them"
        assert mode != "redo" or got["redos"] == 3, "the loud step summed again in its failed attempt and its redo"
        assert got["rows"] == [{**row, "sharded": row["sharded"] or (mode != "die" or row["step"] < FAIL_AT)}
                               if "sharded" in row else row for row in reference["rows"]], f"rank {r}"
