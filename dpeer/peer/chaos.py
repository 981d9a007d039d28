"""`dpeer chaos`: a seeded chaos run of real daemons on 127.0.0.1 training the demo job, then checks.

N nodes (LocalCluster) train the demo job. For `duration` seconds a SEEDED schedule applies one
fault every `fault_every` seconds on average (the gap, kind, victim, length and strength of every
fault come from the seed; which nodes are eligible depends on the run):

  kill       SIGKILL daemon + worker, restart on the same data dir 2-6 s later
  restart    SIGTERM (graceful leave), restart at once on the same data dir
  wipe       SIGKILL, move the data dir aside (never deleted), restart on an empty one: the node
             rejoins as new (same node id, no state) and catches up from its peers
  stop       SIGSTOP daemon + worker, SIGCONT 2-6 s later (a hung box)
  partition  cut one node (a minority) off from the others for 3-8 s, both directions
  loss       the node drops 10-30 % of its outgoing protocol messages for 5-10 s
  slow       the node holds each outgoing protocol message 50-200 ms for 5-10 s

partition, loss and slow go through the test-only transport hook (dpeer/peer/transport/faults.py,
<data_dir>/faults.json). They act on the daemons' control plane (gossip and Raft messages), not
on the workers' Gloo collectives: a partitioned node's worker keeps stepping with the majority
until its daemon has known no leader for `fence_after` (3 x the election timeout max, about 2 s on
the lan preset) and stops it; the majority then re-forms without it, and the node heals and is
re-admitted after the partition heals. At most (N-1)//2 nodes are disrupted (killed, stopped,
wiped, restarting or partitioned, or not yet back in a group) at any time, so a quorum always
remains and training must keep going.

Every fault and recovery is recorded: the fault's time, kind and node; the time from the fault to
the survivors' next committed step (in a new generation, or after the fault ended when the group
never failed); the time from the end of the fault until the node trains in a group again.

Then the checks, each a list of violations (exit 1 if any):
- at most one leader per term across every status sample of every node;
- commit_index never decreases on a node (a wiped node starts a new lifetime);
- one member list per group generation across every node's samples;
- every acknowledged `dpeer kv put` (a background writer runs during the run) reads back with its
  value through every node at the end;
- the audit of every ledger (dpeer/trainer/audit.py): no committed step lost, samples exactly
  once, replicas identical at each (step, generation); ledgers of wiped data dirs included;
- training finished on every node, the final replicas agree, and they match a fault-free
  reference run (a 1-node cluster with the same config) to a max relative difference < 1e-4
  (up to --exact-horizon steps; past it the demo's trajectory is chaotic under float reordering
  and the per-step loss is compared instead: see Run.check_trajectory);
- liveness: after every fault the survivors commit a step within --max-recovery seconds, and every
  faulted node is back in a group by the end.

It prints a summary table and writes <out>/timeline.json (samples of step, world size, generation,
term and role over time; the faults; the checks) and <out>/summary.md. The schedule, not the
timing, is what a seed reproduces: the machine's load decides where in training a fault lands.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dpeer.peer import errors
from dpeer.peer.cluster import LocalCluster, LocalNode
from dpeer.peer.transport.client import Channels, NodeClient
from dpeer.peer.transport.faults import write_faults
from dpeer.peer.transport.options import Security

KINDS = ("kill", "restart", "wipe", "stop", "partition", "loss", "slow")
DISRUPTIVE = {"kill", "restart", "wipe", "stop", "partition"}
MAX_REL_DIFF = 1e-4
BACK_TIMEOUT = 120.0


@dataclass
class ChaosOptions:
    """What a run does; see `dpeer chaos --help`."""

    nodes: int = 3
    duration: float = 120.0
    seed: int = 1
    fault_every: float = 12.0
    kinds: tuple[str, ...] = KINDS
    steps: int = 3000
    global_batch: int = 16
    micro_batch: int = 8
    lr: float = 0.05
    out: Path = Path("chaos-out")
    dir: Path | None = None
    base_port: int | None = None
    poll: float = 0.25
    kv_every: float = 2.0
    warmup_timeout: float = 180.0
    finish_timeout: float = 900.0
    reference: bool = True
    reference_cache: Path | None = None
    exact_horizon: int = 1500
    max_recovery: float = 60.0
    keep_dirs: bool = True


@dataclass
class Fault:
    """One injected fault and what followed it (times in seconds since the run started)."""

    id: int
    kind: str
    nodes: list[str]
    at: float
    planned_s: float
    detail: str = ""
    step_at: int = 0
    gen_at: int = 0
    old_gen_step: int = 0
    ended_at: float | None = None
    step_at_end: int = 0
    recovered_s: float | None = None
    recovered_how: str = ""
    back_s: float | None = None
    out_s: float | None = None
    wiped_to: str | None = None


@dataclass
class Plan:
    """The seeded choices of one fault, drawn before the run knows which nodes are eligible."""

    gap: float
    kind: str
    pick: float
    length: float
    strength: float


def schedule(seed: int, kinds: tuple[str, ...], fault_every: float, count: int = 10_000) -> list[Plan]:
    """The seeded schedule: kinds come in shuffled rounds (every kind once per round)."""
    rng = random.Random(seed)
    plans: list[Plan] = []
    while len(plans) < count:
        order = list(kinds)
        rng.shuffle(order)
        for kind in order:
            plans.append(Plan(rng.uniform(0.5, 1.5) * fault_every, kind, rng.random(), rng.random(), rng.random()))
    return plans[:count]


def _train(doc: dict | None) -> dict:
    return (doc or {}).get("train") or {}


def _group(doc: dict | None) -> dict:
    return (doc or {}).get("group") or {}


class Run:
    """One chaos run: the cluster, the sampler, the fault driver, the writer, then the checks."""

    def __init__(self, opts: ChaosOptions) -> None:
        self.opts = opts
        self.root = opts.dir or Path(tempfile.mkdtemp(prefix="dpeer-chaos-"))
        self.config = {"training": {"steps": opts.steps, "global_batch": opts.global_batch,
                                    "micro_batch": opts.micro_batch, "lr": opts.lr,
                                    "checkpoint_every": 0}}
        self.cluster = LocalCluster(self.root / "cluster", opts.nodes, job="demo", base_port=opts.base_port,
                                    config=self.config)
        self.plans = schedule(opts.seed, opts.kinds, opts.fault_every)
        self.kv_rng = random.Random(opts.seed * 7919 + 1)
        self.t0 = time.monotonic()
        self.samples: list[dict] = []          # {t, node, life, term, role, leader, commit, gen, members, step, world}
        self.latest: dict[str, dict | None] = {}
        self.faults: list[Fault] = []
        self.stopped: set[str] = set()
        self.partitioned: dict[str, set[str]] = {}   # node -> addresses it drops
        self.net: dict[str, tuple[float, float]] = {}  # node -> (loss, delay)
        self.life: dict[str, int] = {n.node_id: 0 for n in self.cluster.nodes}
        self.asides: dict[str, list[Path]] = {n.node_id: [] for n in self.cluster.nodes}
        self.acked: dict[str, str] = {}
        self.kv_attempts = 0
        self.kv_failed = 0
        self.events: list[tuple[float, str]] = []
        self.pending: list[tuple[float, Any]] = []   # (due, coroutine factory)
        self.done_at: float | None = None
        self.chaos_end: float | None = None
        self._channels = Channels(Security())

    # -- time and logging -------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    def say(self, msg: str) -> None:
        self.events.append((round(self.now(), 3), msg))
        print(f"[{self.now():7.1f}s] {msg}", flush=True)

    # -- sampling --------------------------------------------------------------------------
    async def _status(self, node: LocalNode) -> dict | None:
        client = NodeClient(node.addr, channels=self._channels, timeout=1.5)
        try:
            return json.loads((await client.status()).json)
        except (errors.PeerError, ValueError):
            return None

    async def sample(self) -> dict[str, dict | None]:
        live = [n for n in self.cluster.nodes if n.running and n.node_id not in self.stopped]
        docs = await asyncio.gather(*(self._status(n) for n in live))
        t = round(self.now(), 3)
        out: dict[str, dict | None] = {n.node_id: None for n in self.cluster.nodes}
        for node, doc in zip(live, docs):
            out[node.node_id] = doc
            if doc is None:
                continue
            g, tr = _group(doc), _train(doc)
            self.samples.append({
                "t": t, "node": node.node_id, "life": self.life[node.node_id], "term": doc["term"],
                "role": doc["role"], "leader": doc["leader"], "commit": doc["commit_index"],
                "gen": g.get("generation"), "members": g.get("members"), "world": g.get("world_size", 0),
                "step": tr.get("step"), "done": bool((doc.get("worker") or {}).get("done")),
            })
        self.latest = out
        return out

    def survivors_step(self, exclude: list[str]) -> int:
        return max((_train(d).get("step", 0) for n, d in self.latest.items() if n not in exclude and d), default=0)

    def max_gen(self) -> int:
        return max((_group(d).get("generation", 0) for d in self.latest.values() if d), default=0)

    # -- fault-injection helpers -------------------------------------------------------------
    def _write_net(self, node: LocalNode) -> None:
        loss, delay = self.net.get(node.node_id, (0.0, 0.0))
        write_faults(node.data_dir, sorted(self.partitioned.get(node.node_id, set())), loss, delay)

    def disrupted(self) -> set[str]:
        """Nodes under a disruptive fault or not yet back in a group after one."""
        out: set[str] = set()
        for f in self.faults:
            if f.kind in DISRUPTIVE and f.back_s is None and (f.ended_at is None or self.now() - f.ended_at < BACK_TIMEOUT):
                out.update(f.nodes)
        return out

    def busy(self) -> set[str]:
        """Nodes under any fault still in force."""
        return {n for f in self.faults if f.ended_at is None for n in f.nodes}

    def later(self, delay: float, action: Any) -> None:
        self.pending.append((self.now() + delay, action))

    async def inject(self, plan: Plan) -> bool:
        """Apply one planned fault if an eligible victim exists; False to retry a little later."""
        n = len(self.cluster.nodes)
        max_down = (n - 1) // 2
        disrupted, busy = self.disrupted(), self.busy()
        healthy = [x for x in self.cluster.nodes if x.running and x.node_id not in disrupted | busy
                   and x.node_id not in self.stopped and _group(self.latest.get(x.node_id))]
        if plan.kind in DISRUPTIVE and len(disrupted) >= max_down:
            return False
        if not healthy:
            return False
        victim = healthy[int(plan.pick * len(healthy)) % len(healthy)]
        vid = victim.node_id
        length = 2.0 + 4.0 * plan.length
        f = Fault(len(self.faults) + 1, plan.kind, [vid], round(self.now(), 3), round(length, 2),
                  step_at=self.survivors_step([vid]), gen_at=self.max_gen())
        if plan.kind == "kill":
            self.cluster.kill(victim, signal.SIGKILL)
            f.detail = f"down {length:.1f}s"
            self.later(length, lambda: self._restart(f, victim))
        elif plan.kind == "restart":
            f.planned_s = 0.0
            f.detail = "SIGTERM, restart at once"
            await asyncio.to_thread(self.cluster.kill, victim, signal.SIGTERM)
            self._restart(f, victim)
        elif plan.kind == "wipe":
            self.cluster.kill(victim, signal.SIGKILL)
            self.life[vid] += 1
            aside = victim.data_dir.with_name(f"{vid}.wiped{self.life[vid]}")
            victim.data_dir.rename(aside)
            self.asides[vid].append(aside)
            f.wiped_to = str(aside)
            f.detail = f"data dir moved to {aside.name}, down {length:.1f}s"
            if vid in self.partitioned or vid in self.net:
                self._write_net(victim)
            self.later(length, lambda: self._restart(f, victim))
        elif plan.kind == "stop":
            self.cluster.kill(victim, signal.SIGSTOP)
            self.stopped.add(vid)
            f.detail = f"stopped {length:.1f}s"
            self.later(length, lambda: self._cont(f, victim))
        elif plan.kind == "partition":
            length = 3.0 + 5.0 * plan.length
            f.planned_s = round(length, 2)
            others = [x for x in self.cluster.nodes if x is not victim]
            self.partitioned.setdefault(vid, set()).update(x.addr for x in others)
            for x in others:
                self.partitioned.setdefault(x.node_id, set()).add(victim.addr)
            for x in self.cluster.nodes:
                self._write_net(x)
            f.detail = f"{vid} cut from {','.join(x.node_id for x in others)} for {length:.1f}s"
            self.later(length, lambda: self._heal_partition(f, victim))
        else:  # loss / slow
            length = 5.0 + 5.0 * plan.length
            f.planned_s = round(length, 2)
            loss, delay = self.net.get(vid, (0.0, 0.0))
            if plan.kind == "loss":
                loss = round(0.1 + 0.2 * plan.strength, 3)
                f.detail = f"{loss:.0%} outgoing loss for {length:.1f}s"
            else:
                delay = round(0.05 + 0.15 * plan.strength, 3)
                f.detail = f"+{delay * 1000:.0f} ms per outgoing message for {length:.1f}s"
            self.net[vid] = (loss, delay)
            self._write_net(victim)
            self.later(length, lambda: self._heal_net(f, victim))
        self.faults.append(f)
        # The step the survivors had committed when the fault hit: a fresh sample right after it
        # (the previous one is up to `poll` old; a killed peer fails their collective in ms).
        await self.sample()
        f.step_at = self.survivors_step([vid])
        self.say(f"fault {f.id}: {f.kind} {vid} ({f.detail}) at survivors' step {f.step_at}, generation {f.gen_at}")
        return True

    def _end(self, f: Fault) -> None:
        f.ended_at = round(self.now(), 3)
        f.step_at_end = self.survivors_step(f.nodes)

    def _restart(self, f: Fault, node: LocalNode) -> None:
        if not node.running:
            self.cluster.start(node)
        self._write_net(node) if (node.node_id in self.partitioned or node.node_id in self.net) else None
        self._end(f)
        self.say(f"fault {f.id}: restarted {node.node_id}" + (" on an empty data dir" if f.kind == "wipe" else ""))

    def _cont(self, f: Fault, node: LocalNode) -> None:
        self.cluster.kill(node, signal.SIGCONT)
        self.stopped.discard(node.node_id)
        self._end(f)
        self.say(f"fault {f.id}: SIGCONT {node.node_id}")

    def _heal_partition(self, f: Fault, node: LocalNode) -> None:
        self.partitioned.pop(node.node_id, None)
        for x in self.cluster.nodes:
            if x is not node:
                self.partitioned.get(x.node_id, set()).discard(node.addr)
            self._write_net(x)
        self._end(f)
        self.say(f"fault {f.id}: partition of {node.node_id} healed")

    def _heal_net(self, f: Fault, node: LocalNode) -> None:
        loss, delay = self.net.get(node.node_id, (0.0, 0.0))
        self.net[node.node_id] = (0.0, delay) if f.kind == "loss" else (loss, 0.0)
        self._write_net(node)
        self._end(f)
        self.say(f"fault {f.id}: {f.kind} on {node.node_id} ended")

    def track(self) -> None:
        """Record recoveries and returns seen in the latest samples."""
        t = self.now()
        for f in self.faults:
            survivors = {n: d for n, d in self.latest.items() if n not in f.nodes and d}
            if f.recovered_s is None:
                floor = max(f.step_at, f.old_gen_step)
                for d in survivors.values():
                    step, gen = _train(d).get("step", -1), _group(d).get("generation", 0)
                    if gen > f.gen_at and step > floor:
                        f.recovered_s, f.recovered_how = round(t - f.at, 3), "re-formed"
                        break
                    if (f.ended_at is not None or f.kind not in DISRUPTIVE) and step > floor:
                        f.recovered_s, f.recovered_how = round(t - f.at, 3), "same group"
                        break
                if f.recovered_s is None and f.ended_at is None and f.kind in DISRUPTIVE:
                    # steps the old group still commits (a partitioned node's worker trains on until
                    # it is fenced) do not count as recovery: the next step must be a new group's
                    f.old_gen_step = max([f.old_gen_step] + [_train(d).get("step", -1) for d in survivors.values()
                                                             if _group(d).get("generation", 0) <= f.gen_at])
            if f.ended_at is not None and f.back_s is None:
                for vid in f.nodes:
                    d = self.latest.get(vid)
                    if d and vid in (_group(d).get("members") or []) and _train(d).get("step", -1) > f.step_at_end:
                        f.back_s = round(max(0.0, t - f.ended_at), 3)
                        f.out_s = round(t - f.at, 3)
                if f.back_s is None and self.done_at is not None and all(
                        ((self.latest.get(v) or {}).get("worker") or {}).get("done") for v in f.nodes):
                    f.back_s = round(max(0.0, t - f.ended_at), 3)
                    f.out_s = round(t - f.at, 3)

    async def run_pending(self) -> None:
        due = [p for p in self.pending if p[0] <= self.now()]
        self.pending = [p for p in self.pending if p[0] > self.now()]
        for _, action in due:
            action()

    # -- the KV writer -------------------------------------------------------------------------
    async def kv_writer(self, stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set():
            nodes = [n for n in self.cluster.nodes if n.running and n.node_id not in self.stopped]
            if nodes:
                node = self.kv_rng.choice(nodes)
                key, value = f"chaos-{self.opts.seed}-{i}", f"v{i}-{self.kv_rng.getrandbits(32):08x}"
                i += 1
                self.kv_attempts += 1
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "dpeer.peer.cli", "kv", "put", key, value, "--addr", node.addr,
                    "--timeout", "5", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                    env={k: v for k, v in os.environ.items() if not k.startswith("DPEER_")})
                try:
                    code = await asyncio.wait_for(proc.wait(), 30)
                except TimeoutError:
                    proc.kill()
                    code = await proc.wait()
                if code == 0:
                    self.acked[key] = value
                else:
                    self.kv_failed += 1
            try:
                await asyncio.wait_for(stop.wait(), self.opts.kv_every)
            except TimeoutError:
                pass

    # -- the run -----------------------------------------------------------------------------
    async def main(self) -> None:
        o = self.opts
        self.say(f"starting {o.nodes} nodes in {self.root} (seed {o.seed}, {o.duration:.0f}s of chaos, "
                 f"{o.steps} steps, kinds {','.join(o.kinds)})")
        self.cluster.start_all()
        deadline = time.monotonic() + o.warmup_timeout
        while True:
            docs = await self.sample()
            if all(_group(d).get("world_size") == o.nodes and _train(d).get("step", 0) > 5 for d in docs.values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not form a group of {o.nodes} within {o.warmup_timeout:.0f}s")
            await asyncio.sleep(o.poll)
        self.say(f"all {o.nodes} nodes train in one group; chaos starts")
        stop_kv = asyncio.Event()
        writer = asyncio.create_task(self.kv_writer(stop_kv))
        chaos_start = self.now()
        plan_i = 0
        next_at = chaos_start + self.plans[0].gap
        try:
            while True:
                docs = await self.sample()
                await self.run_pending()
                self.track()
                now = self.now()
                if self.done_at is None and any(((d or {}).get("worker") or {}).get("done") for d in docs.values()):
                    self.done_at = now
                    self.say("a worker finished the job")
                in_window = now - chaos_start < o.duration and self.done_at is None
                if in_window and now >= next_at:
                    if await self.inject(self.plans[plan_i]):
                        plan_i += 1
                        next_at = now + self.plans[plan_i].gap
                    else:
                        next_at = now + 1.0
                if not in_window and self.chaos_end is None:
                    self.chaos_end = now
                    self.say(f"chaos window over after {len(self.faults)} faults; healing and letting training finish")
                if self.chaos_end is not None and not self.pending:
                    if all(d and (d.get("worker") or {}).get("done") for d in docs.values()) and \
                            all(f.back_s is not None for f in self.faults if f.kind in DISRUPTIVE):
                        break
                    if now - self.chaos_end > o.finish_timeout:
                        self.say("training did not finish in time")
                        break
                if self.chaos_end is not None and self.pending:
                    for p in self.pending:  # end every fault now
                        p[1]()
                    self.pending = []
                await asyncio.sleep(o.poll)
        finally:
            stop_kv.set()
            await writer
        self.kv_check_result = await self.kv_check()

    async def kv_check(self) -> list[str]:
        problems = []
        for node in self.cluster.nodes:
            client = NodeClient(node.addr, channels=self._channels, timeout=10.0)
            for key, value in self.acked.items():
                reply = None
                for _ in range(5):
                    try:
                        reply = await client.kv_get(key)
                        break
                    except errors.PeerError:
                        await asyncio.sleep(0.5)
                if reply is None:
                    problems.append(f"acknowledged key {key} could not be read through {node.node_id}")
                elif not reply.found or reply.value != value:
                    problems.append(f"acknowledged write lost: {key}={value!r} reads "
                                    f"{reply.value if reply.found else 'absent'!r} through {node.node_id}")
        return problems

    # -- checks --------------------------------------------------------------------------------
    def check_protocol(self) -> dict[str, list[str]]:
        leaders: dict[int, set[str]] = {}
        for s in self.samples:
            if s["role"] == "leader":
                leaders.setdefault(s["term"], set()).add(s["node"])
            if s["leader"]:
                leaders.setdefault(s["term"], set()).add(s["leader"])
        one_leader = [f"term {t} had leaders {sorted(ls)}" for t, ls in sorted(leaders.items()) if len(ls) > 1]
        commit: list[str] = []
        last: dict[tuple[str, int], tuple[float, int]] = {}
        for s in self.samples:
            key = (s["node"], s["life"])
            if key in last and s["commit"] < last[key][1]:
                commit.append(f"{s['node']} commit_index went from {last[key][1]} (t={last[key][0]}s) "
                              f"to {s['commit']} (t={s['t']}s)")
            last[key] = (s["t"], s["commit"])
        views: dict[int, set[tuple]] = {}
        for s in self.samples:
            if s["gen"] is not None:
                views.setdefault(s["gen"], set()).add(tuple(s["members"]))
        view = [f"generation {g} has views {sorted(map(list, vs))}" for g, vs in sorted(views.items()) if len(vs) > 1]
        return {"one leader per term": one_leader, "commit index never decreases": commit,
                "one view per generation": view}

    def check_training(self) -> tuple[list[str], list[str], dict[str, Any]]:
        """Ledger audit and final models, in a child process of the trainer layer
        (dpeer/trainer/chaos_check.py): this module stays free of torch and trainer imports."""
        ledgers = {}
        for node in self.cluster.nodes:
            ledgers[node.node_id] = str(node.data_dir / "worker" / "ledger.jsonl")
            for aside in self.asides[node.node_id]:
                ledgers[f"{node.node_id}@{aside.name}"] = str(aside / "worker" / "ledger.jsonl")
        spec: dict[str, Any] = {
            "ledgers": ledgers, "steps": self.opts.steps, "global_batch": self.opts.global_batch,
            "finals": {n.node_id: str(n.data_dir / "worker" / "final.pt") for n in self.cluster.nodes},
            "exact_horizon": self.opts.exact_horizon, "max_rel_diff": MAX_REL_DIFF,
            "reference_final": None, "reference_ledger": None,
        }
        if self.opts.reference and all(Path(p).exists() for p in spec["finals"].values()):
            spec["reference_final"], spec["reference_ledger"] = map(str, self.reference_paths())
        proc = subprocess.run([sys.executable, "-m", "dpeer.trainer.chaos_check"], input=json.dumps(spec),
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            return [f"the training check failed: {proc.stderr.strip()[-500:]}"], [], {}
        result = json.loads(proc.stdout)
        figures = result["figures"]
        onset = figures.get("trajectory_onset_step")
        if onset is not None:
            figures["faults_before_onset"] = self.faults_before_step(onset)
            self.say(f"loss trajectory matches the fault-free run to 1e-4 up to step {onset} "
                     f"({figures['faults_before_onset']} faults before it); there it departs by "
                     f"{figures['trajectory_onset_gap']:.1e}, {figures['trajectory_onset_after_reform']} steps "
                     f"after the last re-form")
        return result["audit"], result["final"], figures

    def faults_before_step(self, step: int) -> int:
        """How many faults hit before the survivors reached `step` (from the status samples)."""
        reached = next((s["t"] for s in self.samples if (s["step"] or 0) >= step), None)
        return sum(1 for f in self.faults if reached is None or f.at < reached)

    def reference_paths(self) -> tuple[Path, Path]:
        """Final model and ledger of a 1-node, fault-free run of the same config (cached by config)."""
        key = hashlib.sha256(json.dumps(self.config, sort_keys=True).encode()).hexdigest()[:16]
        cache = self.opts.reference_cache
        if cache is not None and (cache / f"reference-{key}.pt").exists():
            self.say(f"reference model from the cache {cache / f'reference-{key}.pt'}")
            return cache / f"reference-{key}.pt", cache / f"reference-{key}.ledger.jsonl"
        self.say("running the fault-free reference (1 node, same config)")
        ref = LocalCluster(self.root / "reference", 1, job="demo", config=self.config)
        done = ref.nodes[0].data_dir / "worker" / "final.pt"
        ledger = ref.nodes[0].data_dir / "worker" / "ledger.jsonl"
        try:
            ref.start_all()
            deadline = time.monotonic() + self.opts.finish_timeout
            while not done.exists() and time.monotonic() < deadline and ref.nodes[0].running:
                time.sleep(0.5)
            time.sleep(0.5)  # torch.save is not atomic: let the worker finish writing and exit
        finally:
            ref.stop_all()
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)
            shutil.copy(done, cache / f"reference-{key}.pt")
            shutil.copy(ledger, cache / f"reference-{key}.ledger.jsonl")
        return done, ledger


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    return f"median {statistics.median(values):.2f}s, max {max(values):.2f}s (n={len(values)})"


def summarize(run: Run, checks: dict[str, list[str]], figures: dict[str, Any], wall: float) -> str:
    o = run.opts
    lines = [f"dpeer chaos: {o.nodes} nodes, seed {o.seed}, {o.duration:.0f}s chaos window "
             f"(ran {run.chaos_end or 0:.0f}s in, {wall:.0f}s wall), {o.steps} steps, {len(run.faults)} faults", "",
             "| # | t (s) | kind | node | detail | survivors' next step (s) | back in a group (s) |",
             "|---|---|---|---|---|---|---|"]
    for f in run.faults:
        rec = "-" if f.recovered_s is None else f"{f.recovered_s:.2f} ({f.recovered_how})"
        back = "-" if f.back_s is None else f"{f.back_s:.2f}"
        lines.append(f"| {f.id} | {f.at:.1f} | {f.kind} | {','.join(f.nodes)} | {f.detail} | {rec} | {back} |")
    lines += ["", "| kind | faults | survivors' next committed step | back in a group after the fault ended |",
              "|---|---|---|---|"]
    for kind in [k for k in KINDS if any(f.kind == k for f in run.faults)] + ["all"]:
        fs = [f for f in run.faults if kind in ("all", f.kind)]
        rec = [f.recovered_s for f in fs if f.recovered_s is not None]
        back = [f.back_s for f in fs if f.back_s is not None and f.kind in DISRUPTIVE]
        lines.append(f"| {kind} | {len(fs)} | {_stats(rec)} | {_stats(back) if kind == 'all' or kind in DISRUPTIVE else 'n/a'} |")
    lines += ["", f"kv writes: {run.kv_attempts} attempted, {len(run.acked)} acknowledged, {run.kv_failed} not "
              f"acknowledged (unavailable during a fault); status samples: {len(run.samples)}; "
              f"ledger records: {figures.get('ledger_records', 0)}; final replicas max rel diff "
              f"{figures.get('replicas_max_rel_diff', float('nan')):.2e}; vs fault-free run "
              f"{figures.get('reference_max_rel_diff', float('nan')):.2e}"
              + ("" if "trajectory_onset_step" not in figures else
                 f" (past the {o.exact_horizon}-step horizon: per-step loss = fault-free run to 1e-4 up to step "
                 f"{figures['trajectory_onset_step']}, after {figures['faults_before_onset']} faults; float-order "
                 f"divergence there, {figures.get('trajectory_onset_after_reform')} steps into a generation)"), "",
              "| check | result |", "|---|---|"]
    for name, problems in checks.items():
        lines.append(f"| {name} | {'ok' if not problems else f'{len(problems)} VIOLATIONS'} |")
    total = sum(len(p) for p in checks.values())
    lines += ["", f"violations: {total}"]
    for name, problems in checks.items():
        for p in problems[:10]:
            lines.append(f"  VIOLATION [{name}] {p}")
        if len(problems) > 10:
            lines.append(f"  ... and {len(problems) - 10} more [{name}]")
    return "\n".join(lines)


def run_chaos(opts: ChaosOptions) -> int:
    """Run, check, print the summary, write the JSON timeline; 0 without violations, 1 with."""
    bad = set(opts.kinds) - set(KINDS)
    if bad or not opts.kinds:
        raise ValueError(f"unknown fault kinds {sorted(bad)}; choose from {','.join(KINDS)}")
    if opts.nodes < 1 or opts.nodes > 9:
        raise ValueError("--nodes must be between 1 and 9")
    if opts.nodes < 3 and set(opts.kinds) & DISRUPTIVE:
        raise ValueError("disruptive faults need at least 3 nodes (a majority must survive)")
    started = time.monotonic()

    def _terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the run like Ctrl-C: every node is still stopped

    signal.signal(signal.SIGTERM, _terminate)
    run = Run(opts)
    opts.out.mkdir(parents=True, exist_ok=True)
    checks: dict[str, list[str]] = {}
    figures: dict[str, Any] = {}
    try:
        try:
            asyncio.run(run.main())
        except TimeoutError as exc:
            checks["cluster formed"] = [str(exc)]
            run.kv_check_result = []
        checks["acknowledged kv writes readable from every node"] = run.kv_check_result
        unfinished = [f"fault {f.id} ({f.kind} {','.join(f.nodes)}): the node was not back in a group"
                      for f in run.faults if f.kind in DISRUPTIVE and f.back_s is None]
        checks["every faulted node back in a group"] = unfinished
        checks["training resumes after every fault (liveness)"] = [
            f"fault {f.id} ({f.kind} {','.join(f.nodes)} at {f.at:.0f}s): the survivors' next committed step "
            f"came {f.recovered_s:.0f}s later (limit {opts.max_recovery:.0f}s)" if f.recovered_s is not None else
            f"fault {f.id} ({f.kind} {','.join(f.nodes)} at {f.at:.0f}s): the survivors never committed another step"
            for f in run.faults if f.recovered_s is None or f.recovered_s > opts.max_recovery]
    finally:
        for node in run.cluster.nodes:
            if node.node_id in run.stopped:
                run.cluster.kill(node, signal.SIGCONT)
        run.cluster.stop_all()
    checks.update(run.check_protocol())
    audit_problems, final_problems, figures = run.check_training()
    checks["ledger audit (steps, samples once, replicas agree)"] = audit_problems
    checks["training finished; final model = fault-free run"] = final_problems
    wall = time.monotonic() - started
    text = summarize(run, checks, figures, wall)
    print(text, flush=True)
    total = sum(len(p) for p in checks.values())
    timeline = {
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "root": str(run.root), "wall_s": round(wall, 1), "chaos_end": run.chaos_end, "done_at": run.done_at,
        "samples": run.samples, "faults": [asdict(f) for f in run.faults], "events": run.events,
        "kv": {"attempted": run.kv_attempts, "acknowledged": len(run.acked), "failed": run.kv_failed},
        "figures": figures, "checks": checks, "violations": total,
    }
    (opts.out / "timeline.json").write_text(json.dumps(timeline, indent=1))
    (opts.out / "summary.md").write_text(text + "\n")
    print(f"timeline: {opts.out / 'timeline.json'}; data and logs: {run.root}", flush=True)
    return 1 if total else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `dpeer chaos` (and scripts/chaos.py)."""
    d = ChaosOptions()
    p.add_argument("--nodes", type=int, default=d.nodes, help=f"daemons to start (default {d.nodes})")
    p.add_argument("--duration", type=float, default=d.duration, help="seconds of fault injection")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the fault schedule")
    p.add_argument("--fault-every", type=float, default=d.fault_every, help="mean seconds between faults")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated fault kinds ({','.join(KINDS)})")
    p.add_argument("--steps", type=int, default=d.steps,
                   help="training steps (size it so training outlasts the chaos window)")
    p.add_argument("--global-batch", type=int, default=d.global_batch)
    p.add_argument("--micro-batch", type=int, default=d.micro_batch)
    p.add_argument("--lr", type=float, default=d.lr, help="demo learning rate (lower: a longer float-order horizon)")
    p.add_argument("--out", type=Path, default=d.out, help="where timeline.json and summary.md go")
    p.add_argument("--dir", type=Path, default=None, help="data dirs and logs (default: a new temp dir)")
    p.add_argument("--base-port", type=int, default=None, help="first gRPC port (default: a free block)")
    p.add_argument("--kv-every", type=float, default=d.kv_every, help="seconds between background kv puts")
    p.add_argument("--warmup-timeout", type=float, default=d.warmup_timeout,
                   help="seconds allowed for every node to train in one group before the faults start")
    p.add_argument("--finish-timeout", type=float, default=d.finish_timeout,
                   help="seconds allowed for training to finish after the chaos window")
    p.add_argument("--max-recovery", type=float, default=d.max_recovery,
                   help="seconds within which the survivors must commit a step after any fault")
    p.add_argument("--no-reference", action="store_true", help="skip the fault-free reference comparison")
    p.add_argument("--exact-horizon", type=int, default=d.exact_horizon,
                   help="up to this many steps the final model must match the fault-free run to 1e-4; "
                        "past it the per-step loss trajectory is compared instead (see check_trajectory)")
    p.add_argument("--reference-cache", type=Path, default=None,
                   help="reuse/keep the reference model here, keyed by the training config")


def options_from(args: argparse.Namespace) -> ChaosOptions:
    """ChaosOptions from parsed flags."""
    return ChaosOptions(
        nodes=args.nodes, duration=args.duration, seed=args.seed, fault_every=args.fault_every,
        kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()), steps=args.steps,
        global_batch=args.global_batch, micro_batch=args.micro_batch, lr=args.lr, out=args.out, dir=args.dir,
        base_port=args.base_port, kv_every=args.kv_every, finish_timeout=args.finish_timeout,
        warmup_timeout=args.warmup_timeout, max_recovery=args.max_recovery,
        reference=not args.no_reference, reference_cache=args.reference_cache, exact_horizon=args.exact_horizon,
    )


def main(argv: list[str] | None = None) -> int:
    """scripts/chaos.py entry point."""
    p = argparse.ArgumentParser(prog="chaos", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run_chaos(options_from(args))
    except ValueError as exc:
        print(f"dpeer chaos: {exc}", file=sys.stderr)
        return 2
