"""One chaos run: the cluster, the status sampler and the loop that drives faults and the kv writer."""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dpeer.chaos.history import final_reads, kv_clients
from dpeer.chaos.inject import inject, pester
from dpeer.chaos.kv import kv_check, kv_writer
from dpeer.chaos.linear import Op
from dpeer.chaos.logs import check_prefixes
from dpeer.chaos.netns import Net, why_not
from dpeer.chaos.options import DISRUPTIVE, ChaosOptions
from dpeer.chaos.prefix import PrefixResult
from dpeer.chaos.sample import (
    done_of,
    fetch_status,
    group_of,
    sample_row,
    train_of,
)
from dpeer.chaos.schedule import Fault, schedule
from dpeer.chaos.stranger import Tally
from dpeer.chaos.track import track
from dpeer.launch.cluster import LocalCluster, LocalNode
from dpeer.transport.client import Channels
from dpeer.chaos.faults import write_faults
from dpeer.transport.options import Security

BACK_TIMEOUT = 120.0
SAMPLE_WAIT = 0.5  # how long a sample round waits for the nodes' answers; slower ones land in a later round


TRAINING_SEED = 1234  # the model's and the data's seed; the fault schedule has its own (--seed)


class Run:
    """One chaos run: the cluster, the sampler, the fault driver, the writer; the checks read its record."""

    def __init__(self, opts: ChaosOptions) -> None:
        self.opts = opts
        self.root = opts.dir or Path(tempfile.mkdtemp(prefix="dpeer-chaos-"))
        self.config = {"training": {"steps": opts.steps, "global_batch": opts.global_batch,
                                    "micro_batch": opts.micro_batch, "lr": opts.lr, "reduction": opts.reduction,
                                    "checkpoint_every": 0, "seed": TRAINING_SEED}}
        self.netns = _namespaces(self.root, opts.nodes) if opts.netns else None
        if self.netns is not None:  # off loopback on a bridge of the run's own: plain gRPC, said in the config
            self.config["security"] = {"insecure": True}
        placement = None if self.netns is None else (lambda i: (self.netns.addr_of(i), self.netns.prefix(i)))
        self.cluster = LocalCluster(self.root / "cluster", opts.nodes, job="demo", base_port=opts.base_port,
                                    config=self.config, entry=("dpeer.chaos.daemon",), placement=placement)
        self.plans = schedule(opts.seed, opts.kinds, opts.fault_every)
        self.kv_rng = random.Random(opts.seed * 7919 + 1)
        self.t0 = time.monotonic()
        self.samples: list[dict] = []          # {t, node, life, term, role, leader, commit, gen, members, step, world}
        self.latest: dict[str, dict | None] = {}
        self.faults: list[Fault] = []
        self.stopped: set[str] = set()
        self.partitioned: dict[str, set[str]] = {}   # node -> addresses it drops
        self.cut: set[str] = set()                   # --netns: nodes whose link is down
        self.net: dict[str, tuple[float, float]] = {}  # node -> (loss, delay)
        self.life: dict[str, int] = {n.node_id: 0 for n in self.cluster.nodes}
        self.asides: dict[str, list[Path]] = {n.node_id: [] for n in self.cluster.nodes}
        self.acked: dict[str, str] = {}
        self.kv_attempts = 0
        self.kv_failed = 0
        self.kv_check_result: list[str] = []
        self.history: list[Op] = []                  # the kv clients' operations (dpeer/chaos/history.py)
        self.prefixes: PrefixResult | None = None    # the committed logs compared at the end
        self.stranger = Tally()                      # what the stranger on the data plane did
        self.stranger_rng = random.Random(opts.seed * 7919 + 2)
        self.events: list[tuple[float, str]] = []
        self.pending: list[tuple[float, Callable[[], None]]] = []   # (due, action)
        self.background: set[asyncio.Task] = set()  # restarts waiting for a graceful exit
        self.done_at: float | None = None
        self.chaos_end: float | None = None
        self.channels = Channels(Security())
        self.fetching: dict[str, tuple[asyncio.Task, int]] = {}  # node -> (its status fetch in flight, its life)

    # -- time and logging -------------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.t0

    def say(self, msg: str) -> None:
        """Print a timestamped event and keep it for the timeline."""
        self.events.append((round(self.now(), 3), msg))
        print(f"[{self.now():7.1f}s] {msg}", flush=True)

    # -- sampling --------------------------------------------------------------------------
    def reachable(self) -> list[LocalNode]:
        """Nodes running, not stopped (SIGSTOP) and not cut off (--netns)."""
        return [n for n in self.cluster.nodes if n.running and n.node_id not in self.stopped | self.cut]

    async def sample(self) -> dict[str, dict | None]:
        """Fetch every reachable node's status, record the samples; node -> document (None: no
        answer yet). Each node's fetch runs on its own: one that is slow to answer (a daemon
        shutting down) is left in flight for a later round instead of holding up this one."""
        for node in self.reachable():
            if node.node_id not in self.fetching:
                task = asyncio.create_task(fetch_status(node, self.channels))
                self.fetching[node.node_id] = (task, self.life[node.node_id])
        if self.fetching:  # none when no node is reachable (asyncio.wait refuses an empty set)
            await asyncio.wait([task for task, _ in self.fetching.values()], timeout=SAMPLE_WAIT)
        t = round(self.now(), 3)
        out: dict[str, dict | None] = {n.node_id: None for n in self.cluster.nodes}
        for node_id, (task, life) in list(self.fetching.items()):
            if not task.done():
                continue
            del self.fetching[node_id]
            doc = task.result()
            out[node_id] = doc
            if doc is not None:
                self.samples.append(sample_row(t, node_id, life, doc))
        self.latest = out
        return out

    def survivors_step(self, exclude: list[str]) -> int:
        """The highest step in the latest samples of the nodes not in `exclude`."""
        return max((train_of(d).get("step", 0) for n, d in self.latest.items() if n not in exclude and d), default=0)

    def max_gen(self) -> int:
        """The highest group generation in the latest samples."""
        return max((group_of(d).get("generation", 0) for d in self.latest.values() if d), default=0)

    # -- fault bookkeeping --------------------------------------------------------------------
    def write_net(self, node: LocalNode) -> None:
        """Write the node's transport fault file from the partitions and loss/delay in force."""
        loss, delay = self.net.get(node.node_id, (0.0, 0.0))
        write_faults(node.data_dir, sorted(self.partitioned.get(node.node_id, set())), loss, delay)

    def number(self, node: LocalNode) -> int:
        """The node's number in the cluster (1..N), its namespace's."""
        return self.cluster.nodes.index(node) + 1

    def close(self) -> None:
        """Remove the namespaces and the bridge (--netns); the cluster is stopped first."""
        if self.netns is not None:
            self.netns.close()

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

    def later(self, delay: float, action: Callable[[], None]) -> None:
        """Run `action` (the end of a fault) `delay` seconds from now."""
        self.pending.append((self.now() + delay, action))

    async def run_pending(self) -> None:
        """Run the actions that are due."""
        due = [p for p in self.pending if p[0] <= self.now()]
        self.pending = [p for p in self.pending if p[0] > self.now()]
        for _, action in due:
            action()

    # -- the run -----------------------------------------------------------------------------
    async def main(self) -> None:
        """Start the cluster, wait for one group, inject faults for the window, let training finish;
        then read the kv back through every node and read every node's committed log."""
        o = self.opts
        self.say(f"starting {o.nodes} nodes in {self.root} (seed {o.seed}, {o.duration:.0f}s of chaos, "
                 f"{o.steps} steps, kinds {','.join(o.kinds)})")
        self.cluster.start_all()
        await self._form()
        self.say(f"all {o.nodes} nodes train in one group; chaos starts")
        await self._chaos_with_clients()
        self.kv_check_result = await kv_check(self)
        await final_reads(self)
        self.prefixes = await check_prefixes(self)

    async def _form(self) -> None:
        """Wait for one group of every node; a stranger visits the workers meanwhile (kind stranger)."""
        formed = asyncio.Event()
        stranger = asyncio.create_task(pester(self, None, formed)) if "stranger" in self.opts.kinds else None
        try:
            await self._warm_up()
        finally:
            formed.set()
            if stranger is not None:
                await stranger

    async def _chaos_with_clients(self) -> None:
        """The chaos loop, with the kv writer and the kv clients running until it ends."""
        stop = asyncio.Event()
        clients = [asyncio.create_task(kv_writer(self, stop)), asyncio.create_task(kv_clients(self, stop))]
        try:
            await self._chaos_loop()
        finally:
            stop.set()
            await asyncio.gather(*clients)

    async def _warm_up(self) -> None:
        o = self.opts
        deadline = time.monotonic() + o.warmup_timeout
        while True:
            docs = await self.sample()
            if all(group_of(d).get("world_size") == o.nodes and train_of(d).get("step", 0) > 5 for d in docs.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not form a group of {o.nodes} within {o.warmup_timeout:.0f}s")
            await asyncio.sleep(o.poll)

    async def _chaos_loop(self) -> None:
        o = self.opts
        chaos_start = self.now()
        plan_i = 0
        next_at = chaos_start + self.plans[0].gap
        while True:
            docs = await self.sample()
            await self.run_pending()
            track(self)
            now = self.now()
            if self.done_at is None and any(done_of(d) for d in docs.values()):
                self.done_at = now
                self.say("a worker finished the job")
            in_window = now - chaos_start < o.duration and self.done_at is None
            if in_window and now >= next_at:
                if await inject(self, self.plans[plan_i]):
                    plan_i += 1
                    next_at = now + self.plans[plan_i].gap
                else:
                    next_at = now + 1.0
            if not in_window and self.chaos_end is None:
                self.chaos_end = now
                self.say(f"chaos window over after {len(self.faults)} faults; healing and letting training finish")
            if self._finished(docs, now):
                break
            if self.chaos_end is not None and self.pending:
                for p in self.pending:  # end every fault now
                    p[1]()
                self.pending = []
            await asyncio.sleep(o.poll)

    def _finished(self, docs: dict[str, dict | None], now: float) -> bool:
        """After the window: every worker done and every faulted node back, or out of time."""
        self.background = {t for t in self.background if not t.done()}
        if self.chaos_end is None or self.pending or self.background:
            return False
        if all(d and done_of(d) for d in docs.values()) and \
                all(f.back_s is not None for f in self.faults if f.kind in DISRUPTIVE):
            return True
        if now - self.chaos_end > self.opts.finish_timeout:
            self.say("training did not finish in time")
            return True
        return False


def _namespaces(root: Path, size: int) -> Net:
    """One network namespace per node on a bridge of the run's own; ValueError where none can be made."""
    reason = why_not()
    if reason:
        raise ValueError(f"--netns: {reason}")
    return Net(root, size)
