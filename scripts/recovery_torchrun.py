"""The torchrun-elastic side of scripts/bench_recovery.py: a never-killed c10d rendezvous store,
one ``torchrun`` agent per box running scripts/torchrun_demo.py, and its kill/restart trials."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from recovery_common import (
    BASE_ENV,
    GLOBAL_BATCH,
    LR,
    MICRO_BATCH,
    NODES,
    ROOT,
    SEED,
    STEPS,
    fmt_bd,
    kill_tree,
    pinned,
    read_jsonl,
    steady_window,
    wait_until,
)

from dpeer.launch.cluster import free_port_block

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


class TorchrunSide:
    """One torchrun-elastic job: its rendezvous store and an agent per box (optionally pinned)."""

    name = "torchrun"

    def __init__(self, root: Path, ckpt_every: int, nodes: list[str] = NODES,
                 cores: dict[str, int] | None = None) -> None:
        self.root = root / "torchrun"
        self.root.mkdir(parents=True)
        self.ckpt_every = ckpt_every
        self.nodes = nodes
        self.cores = cores or {}
        self.port = free_port_block(1, start=31000 + (os.getpid() * 13) % 9000)
        self.store: subprocess.Popen | None = None
        self.agents: dict[str, subprocess.Popen] = {}

    def log(self, node: str) -> list[dict]:
        """Every event the node's workers logged so far."""
        return read_jsonl(self.root / "logs" / f"{node}.jsonl")

    def start_store(self) -> None:
        """Start the rendezvous store process and wait until it serves."""
        with open(self.root / "store.log", "wb") as out:
            self.store = subprocess.Popen([sys.executable, "-c", STORE_SERVER, str(self.port)], stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          env={**os.environ, **BASE_ENV})
        wait_until(lambda: b"ready" in (self.root / "store.log").read_bytes(), 60, "the rendezvous store")

    def start(self, node: str) -> None:
        """Start the node's agent (on its core when pinned)."""
        cmd = ["torchrun", "--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{self.port}", "--rdzv-id=bench", "--max-restarts=100",
               "--monitor-interval=0.1", "--local-addr=127.0.0.1", f"--rdzv-conf={RDZV_CONF}",
               str(ROOT / "scripts" / "torchrun_demo.py"), "--out", str(self.root), "--name", node,
               "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH), "--micro-batch", str(MICRO_BATCH),
               "--seed", str(SEED), "--lr", str(LR), "--ckpt-every", str(self.ckpt_every)]
        env = {**os.environ, **BASE_ENV, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "LOGLEVEL": "INFO"}
        with open(self.root / f"{node}.agent.log", "ab") as out, pinned(self.cores.get(node)):
            self.agents[node] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                 start_new_session=True, cwd=str(ROOT))

    def start_all(self) -> None:
        """Start the store, then every box's agent."""
        self.start_store()
        for n in self.nodes:
            self.start(n)

    def tops(self) -> dict[str, int]:
        """Per box, the pid of its agent (the workers are below it)."""
        return {n: p.pid for n, p in self.agents.items()}

    def kill(self, node: str) -> None:
        """SIGKILL the box's agent and its workers."""
        kill_tree(self.agents[node])

    def stop_all(self) -> None:
        """SIGKILL every agent tree and the store."""
        for p in self.agents.values():
            kill_tree(p)
        if self.store is not None:
            kill_tree(self.store)

    def steps(self, node: str) -> list[dict]:
        """The node's committed-step records: t, step, world."""
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
        """(t, step) of the node's steps committed with every box."""
        return [(r["t"], r["step"]) for r in self.steps(node) if r["world"] == len(self.nodes)]

    def last_step_before(self, nodes: list[str], t: float) -> int:
        """The newest step any of nodes committed by t."""
        return max((r["step"] for n in nodes for r in self.steps(n) if r["t"] <= t), default=0)

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


def phase_breakdown(ph: dict[str, float], start_key: str, since: float, first_step_at: float) -> dict[str, float]:
    """Where a torchrun recovery went: from `since` to the worker's start (named start_key),
    import, build, group init, checkpoint load, first step; and how many workers started."""
    return {start_key: ph.get("start", since) - since,
            "import": ph.get("imported", 0) - ph.get("start", 0),
            "build": ph.get("built", 0) - ph.get("imported", 0),
            "init_group": ph.get("init", 0) - ph.get("built", 0),
            "ckpt_load": ph.get("resumed", 0) - ph.get("init", 0),
            "to_first_step": first_step_at - ph.get("resumed", 0),
            "worker_starts": ph.get("worker_starts", 0)}


def run_torchrun(side: TorchrunSide, trials: int, window: float, log: Callable[[str], None], res: dict) -> dict:
    """Kill and restart one box per trial (victims n2, n3, n1, ...); figures go into res."""
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
        steady_window(side, survivors[0], window, res)
        t_kill = time.time()
        side.kill(victim)
        last = side.last_step_before(survivors, t_kill)
        firsts = wait_until(lambda sv=survivors, tk=t_kill: side.training_together(sv, 2, tk), 180,
                            f"torchrun: survivors of {victim} training")
        t_rec = max(r["t"] for r in firsts.values())
        resumed = min(r["step"] for r in firsts.values()) - 1
        ph = side.phases_after(survivors[0], t_kill)
        bd = phase_breakdown(ph, "to_worker_start", t_kill, firsts[survivors[0]]["t"])
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
        bd = phase_breakdown(ph, "agent_to_worker_start", t_start, t_back)
        res["rejoin"].append(t_back - t_start)
        res["redone_rejoin"].append(max(0, before - resumed2))
        res["rejoin_breakdown"].append(bd)
        log(f"torchrun trial {i + 1}: restarted {victim}; in a group of 3 after {t_back - t_start:.2f}s "
            f"(group went back from step {before} to {resumed2}) {fmt_bd(bd)}")
        wait_until(lambda tb=t_back: side.training_together(NODES, 3, tb, 5), 120, "torchrun: settled")
    return res
