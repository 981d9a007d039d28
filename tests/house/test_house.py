"""The whole-cluster simulation over many seeds: every seed's schedule must keep every invariant.

DPEER_HOUSE_SEEDS seeds per run (default 2000), spread over the CPUs; DPEER_SLOW=1 runs 100000.
A failing seed prints the one command that replays it with the daemons' logs.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.house.cluster import quiet_logs
from tests.house.sim import Result, run

SECONDS, SIZE = 4.0, 3


def _one(seed: int) -> tuple[int, str | None, list[str], float]:
    quiet_logs()
    r = run(seed, SECONDS, SIZE)
    return r.seed, r.violation, r.faults, r.cpu_s


def _seeds() -> int:
    if os.environ.get("DPEER_SLOW") == "1":
        return 100_000
    return int(os.environ.get("DPEER_HOUSE_SEEDS", "2000"))


@pytest.mark.timeout(0 if os.environ.get("DPEER_SLOW") == "1" else 1800)
def test_every_seed_keeps_the_invariants() -> None:
    count, started = _seeds(), time.perf_counter()
    procs = max(1, min(os.cpu_count() or 1, 8))
    # one fresh child per seed, forked from a server that imported the simulation once
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.house.test_house"])
    with ctx.Pool(procs, maxtasksperchild=1) as pool:
        results = pool.map(_one, range(1, count + 1), chunksize=1)
    wall = time.perf_counter() - started
    bad = [r for r in results if r[1] is not None]
    cpu = sum(r[3] for r in results)
    print(f"\n{count} whole-cluster seeds in {wall:.0f}s on {procs} processes ({count / wall:.1f} seeds/s); "
          f"{cpu / count:.3f} CPU-s per seed ({count / cpu:.1f} seeds/s per free core)")
    assert not bad, "\n".join(
        f"seed {seed}: {why}\n  replay: {Result(seed, why).replay(SECONDS, SIZE)}\n  " + "\n  ".join(faults)
        for seed, why, faults, _ in bad[:5])


def test_a_seed_replays_the_same_run() -> None:
    """The same seed, the same run: twice in this process, and in a fresh process whose strings
    hash otherwise (no PYTHONHASHSEED needed, no global patch: the seed is passed explicitly)."""
    quiet_logs()
    a, b = run(7, SECONDS, SIZE), run(7, SECONDS, SIZE)
    assert a.digest and a.faults
    assert (a.violation, a.faults, a.checks, a.commits, a.steps, a.digest) == \
        (b.violation, b.faults, b.checks, b.commits, b.steps, b.digest)
    code = f"from tests.house.sim import run; print(run(7, {SECONDS!r}, {SIZE!r}).digest)"
    for hashseed in ("1", "random"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             timeout=300, check=True, cwd=Path(__file__).parents[2])
        assert out.stdout.split()[-1] == a.digest, f"PYTHONHASHSEED={hashseed} gave another run"
