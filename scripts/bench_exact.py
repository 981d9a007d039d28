"""Exact against fast reduction: steady-state step time of real workers on loopback, side by side.

For each job (the demo, and the demo widened to ~10.4M parameters) it runs the same group of
`--world` worker processes (one thread each, Gloo on 127.0.0.1, ledger on, no daemons: a fixed
view) once per reduction mode, alternating modes over `--repeats` rounds, and prints per mode the
median time between consecutive committed steps (the first `--warmup` steps of each run left out)
and the ratio exact / fast. `--methods` instead times, in this one process, the local work of the
candidate exact reductions per micro-batch on both model sizes, and `--collectives` the Gloo
allreduces each candidate needs per step on the demo's sizes (the figures behind
dpeer/trainer/fixedpoint.py's choice).

    python scripts/bench_exact.py                 # the full comparison (minutes on 2 cores)
    python scripts/bench_exact.py --quick         # a short run, to check that it works
    python scripts/bench_exact.py --methods
    python scripts/bench_exact.py --collectives
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LARGE = {"hidden": "3200"}  # 32*3200 + 3200*3200 + 3200*10 weights: 10.4M parameters


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(world: int, reduction: str, steps: int, options: dict[str, str], root: Path) -> list[float]:
    """Train `steps` steps with `world` workers in one fixed view; the gaps between committed steps (s)."""
    from dpeer.address import Address
    from dpeer.trainer.viewsource import Assignment, View, publish_view, read_reports

    views = root / f"views-{reduction}-{time.monotonic_ns()}"
    views.mkdir(parents=True)
    nodes = [f"w{i}" for i in range(world)]
    publish_view(str(views), Assignment(View(1, tuple(nodes), Address("127.0.0.1", free_port()))))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = []
    for node in nodes:
        cmd = [sys.executable, "-m", "dpeer.trainer.worker", "--node-id", node, "--job", "demo",
               "--views", f"dir:{views}", "--ledger", str(views / f"ledger-{node}.jsonl"),
               "--reduction", reduction, "--threads", "1", "--job-opt", f"steps={steps}"]
        cmd += [a for k, v in options.items() for a in ("--job-opt", f"{k}={v}")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"a {reduction} worker exited {p.returncode}: {err[-2000:]}")
    times = [r["t"] for r in read_reports(str(views), nodes[0]) if r["kind"] == "progress"]
    return [b - a for a, b in zip(times, times[1:])]


def compare(world: int, steps: int, warmup: int, repeats: int, options: dict[str, str], root: Path) -> dict:
    """Median step time of each mode over `repeats` alternating runs, and their ratio."""
    gaps: dict[str, list[float]] = {"fast": [], "exact": []}
    for _ in range(repeats):
        for mode in gaps:
            gaps[mode] += run_group(world, mode, steps, options, root)[warmup:]
    medians = {mode: statistics.median(g) for mode, g in gaps.items()}
    return {**medians, "ratio": medians["exact"] / medians["fast"], "n": min(len(g) for g in gaps.values())}


def params_of(options: dict[str, str]) -> int:
    """Parameters of the demo MLP with these options."""
    from dpeer.trainer.demo import DEFAULTS

    o = {**DEFAULTS, **options}
    dim, hidden, classes = int(o["dim"]), int(o["hidden"]), int(o["classes"])
    return dim * hidden + hidden + hidden * hidden + hidden + hidden * classes + classes


def bench_groups(args: argparse.Namespace) -> None:
    """The side-by-side table of both jobs."""
    root = Path(tempfile.mkdtemp(prefix="dpeer-bench-exact-"))
    jobs = [("demo", {}, args.demo_steps), ("large", LARGE, args.large_steps)]
    print(f"world {args.world}, one thread per worker, {args.repeats} round(s) per mode, first {args.warmup} "
          f"steps of each run left out; median time between committed steps")
    print(f"{'job':<6} {'params':>11} {'steps':>6} {'fast ms':>9} {'exact ms':>9} {'exact/fast':>10}")
    for name, options, steps in jobs:
        r = compare(args.world, steps, args.warmup, args.repeats, options, root)
        print(f"{name:<6} {params_of(options):>11,} {r['n']:>6} {1e3 * r['fast']:>9.2f} {1e3 * r['exact']:>9.2f} "
              f"{r['ratio']:>10.3f}", flush=True)


def bench_methods(repeats: int) -> None:
    """Per micro-batch local cost of each candidate exact reduction, in this process (one thread)."""
    import torch

    from dpeer.trainer import fixedpoint as fx

    torch.set_num_threads(1)

    def median_ms(fn) -> float:
        fn()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(samples)

    print("per micro-batch, ms (one thread); the fast path only accumulates in .grad during backward")
    for params in (params_of({}), params_of(LARGE)):
        nb = -(-params // fx.BUCKET)
        grad = torch.randn(nb, fx.BUCKET) * 1e-3
        row, scratch = torch.empty_like(grad), torch.empty_like(grad)
        acc64, wide = torch.zeros(nb, fx.BUCKET, dtype=torch.float64), torch.empty(nb, fx.BUCKET, dtype=torch.float64)
        acc_i, wide_i = torch.zeros(nb, fx.BUCKET, dtype=torch.int64), torch.empty(nb, fx.BUCKET, dtype=torch.int64)
        amax = torch.empty(nb)
        fx.bucket_amax(grad, amax)
        exps = fx.bucket_exponents(amax, -200) + fx.HEADROOM
        scale = fx.scales(exps, 51, torch.float32, grad.device)

        def f64() -> None:
            row.copy_(grad)
            fx.bucket_amax(row, amax)
            fx.accumulate(acc64, row, scale, wide)

        def i64() -> None:
            row.copy_(grad)
            fx.bucket_amax(row, amax)
            row.mul_(scale).round_()
            wide_i.copy_(row)
            acc_i.add_(wide_i)

        def f32() -> None:
            row.copy_(grad)
            scratch.add_(row)

        rows = {"float32 copy + add (fast)": f32, "fixed point in float64 (chosen)": f64, "fixed point in int64": i64,
                "float64 back-conversion per step": lambda: fx.finish(acc64, exps, 51, 64),
                "int64 back-conversion per step": lambda: wide.copy_(acc_i).mul_(2.0 ** -51)}
        print(f"  {params:,} parameters: " + "; ".join(f"{k} {median_ms(f):.3f}" for k, f in rows.items()), flush=True)
    print("  bytes allreduced per step: fast 4/param, float64 or int64 fixed point 8/param; a gather of every "
          "micro-batch's float32 gradient (no fixed point) 4*M/param")


def _collective_worker(rank: int, world: int, port: int, repeats: int, out: Any) -> None:
    """One rank of the collectives benchmark: median microseconds of each allreduce."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    params, micro = params_of({}), 4
    cases = {"max of 7 int64 exponents (a separate exponent round)": (torch.zeros(7, dtype=torch.int64), dist.ReduceOp.MAX),
             "sum of float32 gradients (fast)": (torch.zeros(params + 1 + world), dist.ReduceOp.SUM),
             "sum of float64 fixed point + slots (exact)": (torch.zeros(params + 64, dtype=torch.float64), dist.ReduceOp.SUM),
             "sum of every micro-batch's float32 gradient (gather)": (torch.zeros(micro * params), dist.ReduceOp.SUM)}
    result = {}
    for name, (buf, op) in cases.items():
        for _ in range(20):
            dist.all_reduce(buf, op=op)
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dist.all_reduce(buf, op=op)
            samples.append(time.perf_counter() - t0)
        result[name] = 1e6 * statistics.median(samples)
    if rank == 0:
        out.put(result)
    dist.destroy_process_group()


def bench_collectives(world: int, repeats: int) -> None:
    """The allreduces a step needs under each candidate, timed in a `world`-process Gloo group."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_collective_worker, args=(r, world, port, repeats, out)) for r in range(world)]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join()
    print(f"Gloo allreduce on 127.0.0.1, world {world}, demo job sizes ({params_of({}):,} parameters, "
          f"4 micro-batches), median us:")
    for name, us in result.items():
        print(f"  {name}: {us:.0f}")


def main() -> int:
    """Parse the flags and run the comparison (or the methods micro-benchmark)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2, help="workers in the group (default 2)")
    p.add_argument("--demo-steps", type=int, default=600)
    p.add_argument("--large-steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5, help="steps left out at the start of each run")
    p.add_argument("--repeats", type=int, default=2, help="alternating runs per mode")
    p.add_argument("--quick", action="store_true", help="a short run to check that the benchmark works")
    p.add_argument("--methods", action="store_true", help="the single-process micro-benchmark of reduction methods")
    p.add_argument("--collectives", action="store_true", help="the allreduces each method needs, in a Gloo group")
    args = p.parse_args()
    if args.quick:
        args.demo_steps, args.large_steps, args.warmup, args.repeats = 60, 8, 3, 1
    if args.methods:
        bench_methods(5 if args.quick else 15)
    elif args.collectives:
        bench_collectives(args.world, 50 if args.quick else 300)
    else:
        bench_groups(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
