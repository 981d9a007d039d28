"""Recovery benchmark (issue 5): dpeer vs a torchrun-elastic baseline on the same job and machine.

Both sides train the demo MLP (``dpeer.trainer.demo``: same seed, data, global batch 64, micro
batch 16, SGD lr 0.05, same per-step sample indices, same manual flat gloo allreduce) on three
"boxes" on loopback, one rank per box, with a full-state checkpoint every ``--ckpt-every`` steps.

- torchrun: three ``torchrun --nnodes=2:3 --nproc-per-node=1 --rdzv-backend=c10d`` agents (one per
  box, same rdzv id and endpoint) each running ``scripts/torchrun_demo.py``. The c10d rendezvous
  store is served by a separate process of this script (the "rendezvous box", never killed), so
  any box can be killed; with torchrun's default the first agent hosts it and killing that box
  ends the job. Agents run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: in torch 2.13 the shared
  agent store is reused across rounds without a per-attempt prefix, so restarted workers read
  the dead round's gloo addresses ("Gloo connectFullMesh failed ... Connection refused") and
  churn through restarts; with it each round's rank 0 worker hosts a fresh store.
- dpeer: ``LocalCluster`` of three ``dpeer start --job demo`` daemons.

A trial: wait until the three boxes train together, measure the step time over a window, SIGKILL
one box (its whole process tree: daemon or agent, and its worker), measure the survivors'
recovery, restart the box on its old data dir, measure when it takes part again. Victims rotate
n2, n3, n1, ... Figures: (1) SIGKILL -> survivors' next committed step (in a group without the
victim); (2) committed steps redone (torchrun: steps since the checkpoint it resumed from; dpeer:
steps that appear twice in a survivor's ledger); (3) restart of the box -> its first committed
step in a group with it, with the restarted worker's own CPU seconds; (4) steady-state step time:
torchrun, dpeer and dpeer with a digest every step (``training.digest_every=1``) each on three
boxes, trained in turn in short windows while the other jobs' training processes are SIGSTOPped
(see ``run_alternating``), reported as the median over rounds of dpeer/torchrun ratios.

Usage: ``python scripts/bench_recovery.py [--quick] [--trials N] [--json FILE] [--keep]``.
Everything started here runs in its own process group and is SIGKILLed on exit, error or Ctrl-C.
Both sides get OMP_NUM_THREADS=1 (three boxes share this machine's cores).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpeer.peer.cluster import LocalCluster, free_port_block
from dpeer.trainer.audit import audit, read_ledger
from dpeer.trainer.demo import DEFAULTS
from dpeer.trainer.sampler import GlobalBatchSampler

NODES = ["n1", "n2", "n3"]
GLOBAL_BATCH, MICRO_BATCH, SEED, LR = 64, 16, 1234, 0.05
STEPS = 10_000_000  # never reached: the run is torn down after the trials
BASE_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# c10d rendezvous: integer seconds only. Defaults are join 600, last_call 30, close 30, keep-alive
# every 5 s with 3 misses allowed (a dead agent leaves the round after ~15 s). These are the
# aggressive-but-safe values used here.
RDZV_CONF = "is_host=false,join_timeout=120,last_call_timeout=1,close_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=3"

STORE_SERVER = """
import datetime as dt, socket, sys, time
import torch.distributed as dist
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(128)
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False,
                      master_listen_fd=s.fileno(), multi_tenant=True, timeout=dt.timedelta(seconds=120))
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


# ----------------------------------------------------------------------------- helpers

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
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def descendants(pid: int) -> list[int]:
    """pid and every process below it (read from /proc), parents first."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2:].split()[1])
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
        for pgid in {proc.pid}:
            try:
                os.killpg(pgid, signal.SIGKILL)
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


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
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


def loadavg() -> float:
    return os.getloadavg()[0]


# ----------------------------------------------------------------------------- torchrun side

class TorchrunSide:
    name = "torchrun"

    def __init__(self, root: Path, ckpt_every: int) -> None:
        self.root = root / "torchrun"
        self.root.mkdir(parents=True)
        self.ckpt_every = ckpt_every
        self.port = free_port_block(1, start=31000 + (os.getpid() * 13) % 9000)
        self.store: subprocess.Popen | None = None
        self.agents: dict[str, subprocess.Popen] = {}

    def log(self, node: str) -> list[dict]:
        return read_jsonl(self.root / "logs" / f"{node}.jsonl")

    def start_store(self) -> None:
        with open(self.root / "store.log", "wb") as out:
            self.store = subprocess.Popen([sys.executable, "-c", STORE_SERVER, str(self.port)], stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          env={**os.environ, **BASE_ENV})
        wait_until(lambda: b"ready" in (self.root / "store.log").read_bytes(), 60, "the rendezvous store")

    def start(self, node: str) -> None:
        cmd = ["torchrun", "--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{self.port}", "--rdzv-id=bench", "--max-restarts=100",
               "--monitor-interval=0.1", "--local-addr=127.0.0.1", f"--rdzv-conf={RDZV_CONF}",
               str(ROOT / "scripts" / "torchrun_demo.py"), "--out", str(self.root), "--name", node,
               "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH), "--micro-batch", str(MICRO_BATCH),
               "--seed", str(SEED), "--lr", str(LR), "--ckpt-every", str(self.ckpt_every)]
        env = {**os.environ, **BASE_ENV, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "LOGLEVEL": "INFO"}
        with open(self.root / f"{node}.agent.log", "ab") as out:
            self.agents[node] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                 start_new_session=True, cwd=str(ROOT))

    def start_all(self) -> None:
        self.start_store()
        for n in NODES:
            self.start(n)

    def kill(self, node: str) -> None:
        kill_tree(self.agents[node])

    def stop_all(self) -> None:
        for p in self.agents.values():
            kill_tree(p)
        if self.store is not None:
            kill_tree(self.store)

    # records: (t, step, world) of committed steps
    def steps(self, node: str) -> list[dict]:
        return [r for r in self.log(node) if r["kind"] == "step"]

    def training_together(self, nodes: list[str], world: int, after: float, min_steps: int = 1) -> dict | None:
        """Per node, its first committed step in a group of `world` after `after` (None if not all yet)."""
        firsts = {}
        for n in nodes:
            rs = [r for r in self.steps(n) if r["t"] > after and r["world"] == world]
            if len(rs) < min_steps:
                return None
            firsts[n] = rs[0]
        return firsts

    def steady_records(self, node: str) -> list[tuple[float, int]]:
        return [(r["t"], r["step"]) for r in self.steps(node) if r["world"] == 3]

    def last_step_before(self, nodes: list[str], t: float) -> int:
        return max((r["step"] for n in nodes for r in self.steps(n) if r["t"] <= t), default=0)

    def resumed_after(self, node: str, t: float) -> dict | None:
        rs = [r for r in self.log(node) if r["kind"] == "resumed" and r["t"] > t]
        return rs[-1] if rs else None

    def phases_after(self, node: str, t: float) -> dict[str, float]:
        """Wall time of the last worker incarnation's start/imported/built/init/resumed after t."""
        recs = [r for r in self.log(node) if r["t"] > t]
        starts = [i for i, r in enumerate(recs) if r["kind"] == "start"]
        if not starts:
            return {}
        last = recs[starts[-1]:]
        out: dict[str, float] = {}
        for r in last:
            if r["kind"] in ("start", "imported", "built", "init", "resumed") and r["kind"] not in out:
                out[r["kind"]] = r["t"]
        out["worker_starts"] = len(starts)
        return out


def run_torchrun(side: TorchrunSide, trials: int, window: float, log: Callable[[str], None], res: dict) -> dict:
    res |= {"recover": [], "redone": [], "rejoin": [], "redone_rejoin": [], "steady": [],
                            "kill_breakdown": [], "rejoin_breakdown": [], "load": []}
    if not side.agents:
        t0 = time.time()
        side.start_all()
        firsts = wait_until(lambda: side.training_together(NODES, 3, t0, 5), 240, "torchrun: 3 boxes training")
        log(f"torchrun: 3 boxes training {max(r['t'] for r in firsts.values()) - t0:.1f}s after launch")
    for i in range(trials):
        victim = NODES[(i + 1) % 3]
        survivors = [n for n in NODES if n != victim]
        w0 = time.time()
        time.sleep(window + random.uniform(0, 1.0))
        w1 = time.time()
        res["steady"] += step_times(side.steady_records(survivors[0]), w0, w1)
        res["load"].append(loadavg())
        t_kill = time.time()
        side.kill(victim)
        last = side.last_step_before(survivors, t_kill)
        firsts = wait_until(lambda sv=survivors, tk=t_kill: side.training_together(sv, 2, tk), 180,
                            f"torchrun: survivors of {victim} training")
        t_rec = max(r["t"] for r in firsts.values())
        resumed = min(r["step"] for r in firsts.values()) - 1
        ph = side.phases_after(survivors[0], t_kill)
        bd = {"to_worker_start": ph.get("start", t_kill) - t_kill,
              "import": ph.get("imported", 0) - ph.get("start", 0),
              "build": ph.get("built", 0) - ph.get("imported", 0),
              "init_group": ph.get("init", 0) - ph.get("built", 0),
              "ckpt_load": ph.get("resumed", 0) - ph.get("init", 0),
              "to_first_step": firsts[survivors[0]]["t"] - ph.get("resumed", 0),
              "worker_starts": ph.get("worker_starts", 0)}
        res["recover"].append(t_rec - t_kill)
        res["redone"].append(max(0, last - resumed))
        res["kill_breakdown"].append(bd)
        log(f"torchrun trial {i + 1}: killed {victim} at step {last}; survivors resumed at step {resumed} "
            f"and committed {t_rec - t_kill:.2f}s later (redone {max(0, last - resumed)}) {fmt_bd(bd)}")
        time.sleep(1.0)
        t_start = time.time()
        side.start(victim)
        back = wait_until(lambda v=victim, ts=t_start: side.training_together([v], 3, ts), 240,
                          f"torchrun: {victim} back in a group of 3")
        t_back = back[victim]["t"]
        before = max((r["step"] for n in survivors for r in side.steps(n) if r["world"] == 2 and r["t"] > t_kill),
                     default=resumed)
        resumed2 = back[victim]["step"] - 1
        ph = side.phases_after(victim, t_start)
        bd = {"agent_to_worker_start": ph.get("start", t_start) - t_start,
              "import": ph.get("imported", 0) - ph.get("start", 0),
              "build": ph.get("built", 0) - ph.get("imported", 0),
              "init_group": ph.get("init", 0) - ph.get("built", 0),
              "ckpt_load": ph.get("resumed", 0) - ph.get("init", 0),
              "to_first_step": t_back - ph.get("resumed", 0),
              "worker_starts": ph.get("worker_starts", 0)}
        res["rejoin"].append(t_back - t_start)
        res["redone_rejoin"].append(max(0, before - resumed2))
        res["rejoin_breakdown"].append(bd)
        log(f"torchrun trial {i + 1}: restarted {victim}; in a group of 3 after {t_back - t_start:.2f}s "
            f"(group went back from step {before} to {resumed2}) {fmt_bd(bd)}")
        wait_until(lambda tb=t_back: side.training_together(NODES, 3, tb, 5), 120, "torchrun: settled")
    return res


def fmt_bd(bd: dict) -> str:
    return "[" + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in bd.items()) + "]"


# ----------------------------------------------------------------------------- dpeer side

class DpeerSide:
    name = "dpeer"

    def __init__(self, root: Path, ckpt_every: int, sub: str = "dpeer", digest_every: int | None = None,
                 base_port: int | None = None) -> None:
        config = {"training": {"steps": STEPS, "global_batch": GLOBAL_BATCH, "micro_batch": MICRO_BATCH,
                               "seed": SEED, "lr": LR, "checkpoint_every": ckpt_every}}
        if digest_every is not None:
            config["training"]["digest_every"] = digest_every
        self.cluster = LocalCluster(root / sub, 3, job="demo", config=config, env=dict(BASE_ENV), base_port=base_port)

    def node(self, n: str):
        return self.cluster.node(n)

    def reports(self, n: str) -> list[dict]:
        return read_jsonl(self.node(n).data_dir / "worker" / "reports" / f"{n}.jsonl")

    def ledger(self, n: str) -> list[dict]:
        return read_ledger(str(self.node(n).data_dir / "worker" / "ledger.jsonl"))

    def daemon_log(self, n: str) -> list[dict]:
        return read_jsonl(self.node(n).log_path)

    def committed_in_group(self, n: str, world: int, after: float) -> tuple[dict, dict] | None:
        """(formed, first progress) of the first group of `world` formed after `after` that committed a step."""
        formed = None
        for r in self.reports(n):
            if r.get("t", 0) <= after:
                continue
            if r["kind"] == "formed":
                formed = r if r.get("world") == world else None
            elif r["kind"] == "progress" and formed is not None:
                return formed, r
        return None

    def training_together(self, nodes: list[str], world: int, after: float) -> dict | None:
        got = {}
        for n in nodes:
            c = self.committed_in_group(n, world, after)
            if c is None:
                return None
            got[n] = c
        return got

    def steady_records(self, n: str) -> list[tuple[float, int]]:
        """Committed steps in groups of 3."""
        out, world = [], 0
        for r in self.reports(n):
            if r["kind"] == "formed":
                world = r.get("world", 0)
            elif r["kind"] == "progress" and world == 3:
                out.append((r["t"], r["step"]))
        return out

    def settled(self, after: float) -> bool:
        """Every box's latest group is of 3 and it committed 5 steps in it after `after`."""
        for n in NODES:
            recs = self.reports(n)
            formed = [i for i, r in enumerate(recs) if r["kind"] == "formed"]
            if not formed or recs[formed[-1]].get("world") != 3:
                return False
            if sum(1 for r in recs[formed[-1]:] if r["kind"] == "progress" and r["t"] > after) < 5:
                return False
        return True

    def role(self, n: str) -> str:
        doc = asyncio.run(self.cluster.status(self.node(n)))
        return (doc or {}).get("role", "?")


def run_dpeer(side: DpeerSide, trials: int, window: float, log: Callable[[str], None], res: dict) -> dict:
    res |= {"recover": [], "redone": [], "rejoin": [], "redone_rejoin": [], "steady": [],
                            "kill_breakdown": [], "rejoin_breakdown": [], "load": [], "victim_role": []}
    c = side.cluster
    t0 = time.time()
    c.start_all()
    got = wait_until(lambda: side.training_together(NODES, 3, t0), 240, "dpeer: 3 boxes training", 0.05)
    log(f"dpeer: 3 boxes training {max(p['t'] for _f, p in got.values()) - t0:.1f}s after launch")
    for i in range(trials):
        victim = NODES[(i + 1) % 3]
        survivors = [n for n in NODES if n != victim]
        w0 = time.time()
        time.sleep(window + random.uniform(0, 1.0))
        w1 = time.time()
        res["steady"] += step_times(side.steady_records(survivors[0]), w0, w1)
        res["load"].append(loadavg())
        role = side.role(victim)
        res["victim_role"].append(role)
        marks = {n: len(side.ledger(n)) for n in survivors}
        t_kill = time.time()
        c.kill(side.node(victim), signal.SIGKILL)
        got = wait_until(lambda sv=survivors, tk=t_kill: side.training_together(sv, 2, tk), 120,
                         f"dpeer: survivors of {victim} training", 0.02)
        t_rec = max(p["t"] for _f, p in got.values())
        redone = 0
        for n in survivors:
            led = side.ledger(n)
            seen = {e["step"] for e in led[: marks[n]]}
            redone = max(redone, sum(1 for e in led[marks[n]:] if e["step"] in seen))
        f0, p0 = got[survivors[0]]
        fails = [r for r in side.reports(survivors[0]) if r["kind"] == "failed" and t_kill < r["t"] <= f0["t"]]
        t_fail = fails[0].get("caught_t", fails[0]["t"]) if fails else None
        t_form_start = f0["t"] - f0.get("seconds", 0.0)
        bd = {"detect(failed)": (t_fail - t_kill) if t_fail else float("nan"),
              "wait_view": t_form_start - (t_fail or t_kill),
              "form": f0.get("form_s", float("nan")), "heal": f0.get("heal_s", float("nan")),
              "to_first_step": p0["t"] - f0["t"]}
        res["recover"].append(t_rec - t_kill)
        res["redone"].append(redone)
        res["kill_breakdown"].append(bd)
        log(f"dpeer trial {i + 1}: killed {victim} ({role}); survivors committed in a group of 2 "
            f"{t_rec - t_kill:.3f}s later at step {p0['step']} (redone {redone}) {fmt_bd(bd)}")
        time.sleep(1.0)
        marks2 = {n: len(side.ledger(n)) for n in survivors}
        t_start = time.time()
        c.start(side.node(victim))
        got = wait_until(lambda v=victim, ts=t_start: side.training_together([v], 3, ts), 180,
                         f"dpeer: {victim} back in a group of 3", 0.02)
        f1, p1 = got[victim]
        dl = [r for r in side.daemon_log(victim) if r.get("ts", 0) > t_start]
        t_joined = next((r["ts"] for r in dl if "ready True" in r.get("msg", "")), None)
        rep = [r for r in side.reports(victim) if r["t"] > t_start]
        built = next((r for r in rep if r["kind"] == "built"), {})
        t_wait = next((r["t"] for r in rep if r["kind"] == "waiting"), None)
        nan = float("nan")
        bd = {"start_to_built": built.get("t", nan) - t_start,
              "worker_import_cpu": built.get("import_cpu_s", nan), "worker_build_cpu": built.get("build_cpu_s", nan),
              "built_to_ready": (t_wait - built.get("t", nan)) if t_wait else nan,
              "ready_to_join_acked": (t_joined - t_wait) if (t_wait and t_joined) else nan,
              "wait_view": (f1["t"] - f1.get("seconds", 0) - t_wait) if t_wait else nan,
              "form": f1.get("form_s", nan), "heal": f1.get("heal_s", nan),
              "to_first_step": p1["t"] - f1["t"]}
        res["rejoin"].append(p1["t"] - t_start)
        res["rejoin_breakdown"].append(bd)
        # does the group go back when the box rejoins? steps committed twice after the restart
        again = 0
        for n in survivors:
            led = side.ledger(n)
            seen = {e["step"] for e in led[: marks2[n]]}
            again = max(again, sum(1 for e in led[marks2[n]:] if e["step"] in seen))
        res["redone_rejoin"].append(again)
        log(f"dpeer trial {i + 1}: restarted {victim}; it committed in a group of 3 after "
            f"{p1['t'] - t_start:.2f}s at step {p1['step']} {fmt_bd(bd)}")
        wait_until(lambda t=p1["t"]: side.settled(t), 120, "dpeer: settled", 0.05)
    # audit every ledger: no committed step lost, seeded samples, replicas agree. audit() counts a
    # sample seen in two epochs as "consumed twice", so that check is redone here per epoch.
    ledgers = {n: side.ledger(n) for n in NODES}
    upto = min(max((e["step"] for e in led), default=-1) for led in ledgers.values()) + 1
    problems = [p for p in audit(ledgers, upto, GlobalBatchSampler(DEFAULTS["dataset_len"], GLOBAL_BATCH, SEED))
                if "consumed twice" not in p]
    by_step = {e["step"]: e["indices"] for led in ledgers.values() for e in led if e["step"] < upto}
    per_epoch = DEFAULTS["dataset_len"] // GLOBAL_BATCH
    for ep in range(0, upto, per_epoch):
        seen = [i for st in range(ep, min(ep + per_epoch, upto)) for i in by_step.get(st, [])]
        if len(seen) != len(set(seen)):
            problems.append(f"epoch from step {ep}: {len(seen) - len(set(seen))} samples consumed twice")
    res["audit"] = {"steps_checked": upto, "problems": problems}
    log(f"dpeer audit over steps 0..{upto - 1}: {'clean' if not problems else problems[:5]}")
    return res


# ----------------------------------------------------------------------------- steady state

ALT_WINDOW, ALT_SETTLE = 0.5, 0.1  # s per arm and window; steps in a window's first 0.1 s are skipped


def worker_pids(side: TorchrunSide | DpeerSide) -> list[int]:
    """The training processes of a side: everything below its agents or daemons, not those."""
    if isinstance(side, TorchrunSide):
        tops = [p.pid for p in side.agents.values()]
    else:
        tops = [side.node(n).proc.pid for n in NODES]
    return [pid for top in tops for pid in descendants(top)[1:]]


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def run_alternating(arms: dict[str, TorchrunSide | DpeerSide], rounds: int, log: Callable[[str], None],
                    res: dict) -> None:
    """Every job trains on three boxes, but only one at a time: in each round every arm gets one
    ALT_WINDOW while the other arms' training processes are SIGSTOPped (their daemons and agents
    keep running). The arms always take turns in the same cycle, so no job is paused for more
    than two windows (1 s), well below dpeer's 2 s collective-timeout floor (a rotating order
    paused some for four and made their groups time out and re-form). A round's arms see the
    same background load, so the per-round ratios of median step times are what this reports
    (median and quartiles over the rounds); dpeer group failures during the rounds are counted."""
    t0 = time.time()
    for side in arms.values():
        if isinstance(side, TorchrunSide):
            side.start_all()
        else:
            side.cluster.start_all()
    wait_until(lambda: all(s.training_together(NODES, 3, t0) for s in arms.values()), 300,
               "every job training with 3 boxes", 0.1)
    log(f"alternating: {', '.join(arms)} training {time.time() - t0:.1f}s after launch")
    time.sleep(2.0)
    pids = {name: worker_pids(side) for name, side in arms.items()}
    names = list(arms)
    windows: list[tuple[int, str, float, float]] = []
    t_begin = time.time()
    try:
        for k in range(rounds):
            for name in names:
                for other in names:
                    if other != name:
                        signal_all(pids[other], signal.SIGSTOP)
                signal_all(pids[name], signal.SIGCONT)
                w0 = time.time()
                time.sleep(ALT_WINDOW)
                windows.append((k, name, w0 + ALT_SETTLE, time.time()))
            if k % 10 == 9:
                log(f"alternating: {k + 1}/{rounds} rounds")
    finally:
        for name in names:
            signal_all(pids[name], signal.SIGCONT)
    records = {name: side.steady_records("n1") for name, side in arms.items()}
    res["failed_reports"] = {name: sum(1 for n in NODES for r in side.reports(n)
                                       if r["kind"] == "failed" and r["t"] > t_begin)
                             for name, side in arms.items() if isinstance(side, DpeerSide)}
    per: dict[str, list[float | None]] = {name: [None] * rounds for name in names}
    rate: dict[str, list[float | None]] = {name: [None] * rounds for name in names}
    for k, name, w0, w1 in windows:
        xs = step_times(records[name], w0, w1)
        per[name][k] = med(xs)
        rate[name][k] = len(xs) / (w1 - w0) if xs else None
    base = names[0]
    res |= {"window": ALT_WINDOW, "rounds": rounds, "median_step": {n: per[n] for n in names},
            "steps_per_s": {n: rate[n] for n in names}, "load": loadavg(), "ratio": {}, "mean_ratio": {}}
    for name in names[1:]:
        ratios = [a / b for a, b in zip(per[name], per[base]) if a and b]
        means = [b / a for a, b in zip(rate[name], rate[base]) if a and b]
        res["ratio"][name], res["mean_ratio"][name] = ratios, means
        log(f"alternating {name}/{base} over {len(ratios)} rounds: median-step ratio {spread(ratios)}, "
            f"mean-step ratio {spread(means)}; median steps {fmt_ms(med(per[name]))} vs {fmt_ms(med(per[base]))}")
    log(f"alternating: dpeer group failures during the rounds {res['failed_reports']}")


def spread(xs: list[float]) -> str:
    """Median [quartiles] of a list."""
    if len(xs) < 2:
        return "n/a"
    q = statistics.quantiles(xs, n=4)
    return f"{statistics.median(xs):.3f} [{q[0]:.3f}-{q[2]:.3f}]"


def fmt_ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f} ms"


# ----------------------------------------------------------------------------- report

def summary(tr: dict, dp: dict, alt: dict) -> str:
    def s(x: float | None, unit: str = "s", nd: int = 2) -> str:
        return "n/a" if x is None else f"{x:.{nd}f} {unit}".strip()

    def mx(xs: list) -> str:
        xs = [x for x in xs if x is not None]
        return f"{max(xs):.2f}" if xs else "n/a"

    rows = []
    t_st, d_st = med(tr["steady"]), med(dp["steady"])
    rows.append(("SIGKILL -> survivors' next committed step", f"{s(med(tr['recover']))} (max {mx(tr['recover'])})",
                 f"{s(med(dp['recover']), 's', 3)} (max {mx(dp['recover'])})", "< 0.5 s"))
    rows.append(("committed steps redone after the kill", f"{med(tr['redone'])} (max {mx(tr['redone'])})",
                 f"{med(dp['redone'])} (max {mx(dp['redone'])})", "0 lost"))
    rows.append(("restart -> box in a committed step", f"{s(med(tr['rejoin']))} (max {mx(tr['rejoin'])})",
                 f"{s(med(dp['rejoin']))} (max {mx(dp['rejoin'])})", "< 2.5 s"))
    rows.append(("steps redone when it rejoins", f"{med(tr['redone_rejoin'])}", f"{med(dp['redone_rejoin'])}", ""))
    steps = alt.get("median_step", {})
    for name, ratios in alt.get("ratio", {}).items():
        rows.append((f"steady step, {name} vs torchrun, alternating {alt['window']} s windows, {len(ratios)} rounds",
                     fmt_ms(med(steps.get("torchrun", []))), fmt_ms(med(steps.get(name, []))),
                     f"median of per-round ratios {spread(ratios)}; mean-step ratio {spread(alt['mean_ratio'][name])}"
                     " (target < 1.03)"))
    rows.append(("steady step time, 3 boxes, each alone (during its trials)", s(t_st * 1e3 if t_st else None, "ms", 2),
                 s(d_st * 1e3 if d_st else None, "ms", 2),
                 f"ratio {d_st / t_st:.3f}" if t_st and d_st else ""))
    out = ["| measurement | torchrun elastic | dpeer | target |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="1 torchrun and 2 dpeer kills, 2 s trial windows, 10 alternating rounds (about 3 min)")
    ap.add_argument("--trials", type=int, default=None,
                    help="kills per side (default 4 torchrun, 5 dpeer; quick 1 and 2)")
    ap.add_argument("--window", type=float, default=None, help="steady window per trial, s (default 5, quick 2)")
    ap.add_argument("--ckpt-every", type=int, default=100, help="checkpoint interval, steps (both sides)")
    ap.add_argument("--only", choices=["torchrun", "dpeer"], default=None)
    ap.add_argument("--json", default=None, help="write every raw figure here")
    ap.add_argument("--keep", action="store_true", help="keep the run directory (logs, ledgers)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    trials_tr = args.trials or (1 if args.quick else 4)
    trials_dp = args.trials or (2 if args.quick else 5)
    rounds = 10 if args.quick else 30
    window = args.window or (2.0 if args.quick else 5.0)
    random.seed(args.seed)
    root = Path(tempfile.mkdtemp(prefix="bench_recovery_"))
    began = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - began:6.1f}s load {loadavg():.1f}] {msg}", flush=True)

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    import torch

    log(f"{platform.node()} {os.cpu_count()} cpus, Python {platform.python_version()}, torch {torch.__version__}; "
        f"{trials_tr} torchrun / {trials_dp} dpeer kills, window {window:.0f}s, checkpoint every {args.ckpt_every} steps; dir {root}")
    results: dict[str, Any] = {"trials": [trials_tr, trials_dp], "window": window, "ckpt_every": args.ckpt_every,
                               "rdzv_conf": RDZV_CONF, "date": time.strftime("%Y-%m-%d %H:%M")}
    tr_side = dp_side = None
    try:
        if args.only is None:
            tr_side = TorchrunSide(root, args.ckpt_every)
            dp_side = DpeerSide(root, args.ckpt_every, "dpeer-steady")
            d1_side = DpeerSide(root, args.ckpt_every, "dpeer-digest1", digest_every=1,
                                base_port=free_port_block(3, start=dp_side.node("n3").port + 2))
            results["alternating"] = {}
            try:
                run_alternating({"torchrun": tr_side, "dpeer": dp_side, "dpeer digest_every=1": d1_side}, rounds,
                                log, results["alternating"])
            finally:
                d1_side.cluster.stop_all()
            dp_side.cluster.stop_all()
        if args.only in (None, "torchrun"):
            tr_side = tr_side or TorchrunSide(root, args.ckpt_every)
            results["torchrun"] = {}
            run_torchrun(tr_side, trials_tr, window, log, results["torchrun"])
            tr_side.stop_all()
        if args.only in (None, "dpeer"):
            dp_side = DpeerSide(root, args.ckpt_every)
            results["dpeer"] = {}
            run_dpeer(dp_side, trials_dp, window, log, results["dpeer"])
            dp_side.cluster.stop_all()
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        return 130
    finally:
        if tr_side is not None:
            tr_side.stop_all()
        if dp_side is not None:
            dp_side.cluster.stop_all()
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    empty = {"recover": [], "redone": [], "rejoin": [], "redone_rejoin": [], "steady": []}
    tr, dp = results.get("torchrun", empty), results.get("dpeer", empty)
    print()
    print(summary(tr, dp, results.get("alternating", {})))
    for name, r in (("torchrun", tr), ("dpeer", dp)):
        if r.get("recover"):
            print(f"{name}: recover {[round(x, 3) for x in r['recover']]} rejoin {[round(x, 2) for x in r['rejoin']]} "
                  f"redone {r['redone']} load {[round(x, 1) for x in r.get('load', [])]}")
            for key in ("kill_breakdown", "rejoin_breakdown"):
                bds = r.get(key) or []
                if bds:
                    keys = bds[0].keys()
                    print(f"  {key} (median): " + ", ".join(f"{k} {med([b[k] for b in bds]):.3f}" for k in keys))
    if dp.get("audit"):
        print(f"dpeer audit: {dp['audit']}")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
