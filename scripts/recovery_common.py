"""Shared pieces of scripts/bench_recovery.py: the job's settings, process trees, CPU pinning and
accounting from /proc, and the step-time arithmetic both sides use."""

from __future__ import annotations

import itertools
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NODES = ["n1", "n2", "n3"]
GLOBAL_BATCH, MICRO_BATCH, SEED, LR = 64, 16, 1234, 0.05
STEPS = 10_000_000  # never reached: the run is torn down after the trials
BASE_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def read_jsonl(path: Path) -> list[dict]:
    """Complete JSON lines of a file that another process appends to."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def med(xs: list[float | None]) -> float | None:
    """Median of the values that are not None; None when there are none."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (field 3, the state, first)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2:].split()


def descendants(pid: int) -> list[int]:
    """pid and every process below it (read from /proc), parents first."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ppid = int(_stat_fields(int(d))[1])
        except OSError:
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process we started, its process group and every descendant (torchrun starts its
    workers in their own sessions, so the group alone is not the whole box); then reap it."""
    if proc.poll() is None:
        pids = descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def signal_all(pids: list[int], sig: int) -> None:
    """Send sig to each pid, skipping those already gone."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll pred until it returns something truthy and return that; TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def step_times(records: list[tuple[float, int]], t0: float, t1: float) -> list[float]:
    """Intervals between consecutive committed steps (t, step) inside [t0, t1]."""
    rs = sorted((t, s) for t, s in records if t0 <= t <= t1)
    return [b[0] - a[0] for a, b in itertools.pairwise(rs) if b[1] == a[1] + 1]


def import_floor() -> dict[str, float]:
    """Wall and CPU seconds of a bare `import torch`, and of `import torch, torch._dynamo` (which
    the optimizer's first step imports): the floor a fresh worker cannot beat, on this box now."""
    out = {}
    for name, code in (("torch", "import torch"), ("torch+dynamo", "import torch, torch._dynamo")):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.monotonic()
        subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out[f"{name}_wall_s"] = time.monotonic() - t
        out[f"{name}_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out


def loadavg() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def steady_window(side: Any, survivor: str, window: float, res: dict) -> None:
    """Train undisturbed for `window` (plus up to 1 s of jitter) before a trial's kill; add the
    survivor's step intervals to res["steady"] and the load to res["load"]."""
    w0 = time.time()
    time.sleep(window + random.uniform(0, 1.0))
    res["steady"] += step_times(side.steady_records(survivor), w0, time.time())
    res["load"].append(loadavg())


@contextmanager
def pinned(core: int | None) -> Iterator[None]:
    """Run the block with this thread on `core` alone, so processes started in it (and all their
    descendants) inherit that CPU mask; no-op for None."""
    if core is None:
        yield
        return
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def thread_cpus(pid: int) -> set[int]:
    """Union of the CPU masks of every thread of pid (empty once it is gone)."""
    cpus: set[int] = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                cpus |= os.sched_getaffinity(int(tid))
            except OSError:
                continue
    except OSError:
        pass
    return cpus


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of pid, all its threads, from /proc/PID/stat (None once it is gone)."""
    try:
        f = _stat_fields(pid)
    except OSError:
        return None
    return (int(f[11]) + int(f[12])) / CLK_TCK


def core_busy(cores: list[int]) -> dict[int, float]:
    """Busy CPU seconds so far (everything but idle and iowait) of each core, from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *vals = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            v = [int(x) for x in vals]
            out[int(name[3:])] = (sum(v[:8]) - v[3] - v[4]) / CLK_TCK
    return out


def spread(xs: list[float]) -> str:
    """Median [quartiles] of a list."""
    if len(xs) < 2:
        return "n/a"
    q = statistics.quantiles(xs, n=4)
    return f"{statistics.median(xs):.3f} [{q[0]:.3f}-{q[2]:.3f}]"


def median_ci(xs: list[float], level: float = 0.95, resamples: int = 2000) -> tuple[float, float] | None:
    """Percentile-bootstrap confidence interval of the median of xs (seeded, so reruns agree)."""
    if len(xs) < 5:
        return None
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    lo = int((1 - level) / 2 * resamples)
    return meds[lo], meds[resamples - 1 - lo]


def fmt_ms(x: float | None) -> str:
    """Seconds as milliseconds, n/a for None."""
    return "n/a" if x is None else f"{x * 1e3:.2f} ms"


def fmt_bd(bd: dict) -> str:
    """A breakdown dict as one bracketed line."""
    return "[" + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in bd.items()) + "]"
