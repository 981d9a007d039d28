"""N complete daemons in one process on the virtual clock, over the in-memory network.

Each box is the real dpeer Daemon (node driver, leader chores, service, resync, checkpoint
recording, views) on a real LMDB Store in a tmpfs folder, with a modelled worker of a drawn speed,
in configured sites (half the seeds) or measured ones. Boxes crash
(every task of the box cancelled, the store closed), restart from their disk, lose the disk,
lose power in the middle of a log append (the write torn: tests/support/disk.py), pause; the
network partitions (also one way), loses and delays. Operators call the services as `dpeer`
would: kv put/get, join, leave, force.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from dpeer.clock import LoopClock
from dpeer.consensus.entry import Entry
from dpeer.daemon.config import NodeConfig
from dpeer.daemon.daemon import Daemon
from dpeer.ids import SeededIds
from dpeer.sim.network import LinkPolicy, SimNetwork
from dpeer.statemachine.entry import EntryKind
from dpeer.statemachine.store import Store
from dpeer.statemachine.txn import TORN_ZEROS
from dpeer.transport.memory import MemoryClient, MemoryNetwork
from dpeer.transport.options import Security

from tests.support.disk import tear, torn_bytes
from tests.house.loop import VirtualLoop
from tests.house.worker import BUILD_S, STEP_S, SimWorker, Training

OPERATOR = "operator"


@dataclass
class Box:
    """One simulated machine: its identity, disk, and (while up) daemon."""

    node_id: str
    addr: str
    data_dir: Path
    worker: SimWorker
    daemon: Daemon | None = None
    task: asyncio.Task | None = None
    lives: int = 0
    paused: bool = False
    gone: bool = False  # left the cluster for good (or never started)

    @property
    def up(self) -> bool:
        """True while its daemon runs (paused or not)."""
        return self.daemon is not None


class House:
    """The simulated cluster; every choice comes from `seed`."""

    def __init__(self, loop: VirtualLoop, seed: int, root: Path, size: int = 3, spares: int = 1,
                 unready: frozenset[str] = frozenset()) -> None:
        """unready: boxes whose job never builds (they are members but never train)."""
        self.loop, self.seed, self.root = loop, seed, root
        self.rng = random.Random(seed)
        self.id_seeds = random.Random(seed ^ 0x1D5)  # each start's id source (store uid, boot id, view secrets)
        self.links = SimNetwork(random.Random(seed ^ 0x5EED), LinkPolicy(delay_min=0.0005, delay_max=0.003))
        self.net = MemoryNetwork(self.links)
        self.clock = LoopClock(loop)
        self.data_cut: set[tuple[str, str]] = set()
        self.training = Training(loop.time, loop.call_later, lambda a, b: (a, b) not in self.data_cut)
        self.boxes: dict[str, Box] = {}
        # speeds and sites from their own source, so the fault schedule (the seed's rng) is as before
        mixed = random.Random(seed ^ 0x5B3ED)
        placed = mixed.random() < 0.5  # half the seeds configure sites, the others measure them
        self.sites = {f"n{i + 1}": mixed.choice(("lab-a", "lab-b")) if placed else None for i in range(size + spares)}
        for i in range(size + spares):
            nid = f"n{i + 1}"
            worker = SimWorker(self.training, nid, 29500 + i, float("inf") if nid in unready else BUILD_S)
            worker.base_speed = mixed.choice((4.0, 8.0, 16.0))
            self.training.workers[nid] = worker
            self.boxes[nid] = Box(nid, f"10.0.0.{i + 1}:7100", root / nid, worker, gone=i >= size)
        self.founders = [f"n{i + 1}" for i in range(size)]
        self.strangers: set[str] = set()  # boxes of another cluster (planted scenarios)
        self.faulty_until = 0.0  # when the last fault drawn so far ends
        self.operator_paused = False  # a scenario may stop the operator's kv traffic

    # -- boxes ---------------------------------------------------------------------------------
    def start(self, nid: str, join: list[str] | None = None) -> None:
        """Start nid's daemon on its disk (joining through `join`, default every other box)."""
        box = self.boxes[nid]
        assert box.daemon is None, f"{nid} is already up"
        peers = join if join is not None else [b.addr for b in self.boxes.values() if b is not box and not b.gone]
        box.data_dir.mkdir(parents=True, exist_ok=True)
        config = NodeConfig(node_id=nid, listen=box.addr, data_dir=box.data_dir, join=peers, preset="lan",
                            site=self.sites[nid])
        ids = SeededIds(self.id_seeds.getrandbits(64))
        store = Store.open(box.data_dir / "store", node_id=nid, ids=ids)
        box.worker.start(self.loop.time())
        box.lives += 1
        box.gone = False
        ctx = self.loop.context_of(f"{nid}#{box.lives}")
        box.worker.context = ctx
        daemon = Daemon(config, store, Security(), box.worker, transport=self.net.transport(nid, box.addr),
                        clock=self.clock, seed=self.rng.randrange(1 << 32), ids=ids)
        box.daemon = daemon
        link = daemon.link
        assert link is not None
        link.rings, box.worker.bell, box.worker.exited = True, link.ring, link.worker_exited
        self.net.attach(box.addr, nid, daemon.service, ctx)
        box.task = self.loop.create_task(daemon.run_node(), context=ctx)
        box.task.add_done_callback(lambda t, box=box, d=daemon: self._ended(box, d, t))

    def _ended(self, box: Box, daemon: Daemon, task: asyncio.Task) -> None:
        """The daemon's loop returned (it left, or stopped on its own): the process exits."""
        if box.daemon is not daemon or task.cancelled():
            return
        if task.exception() is not None:
            self.net.crashes.append(f"{box.node_id}: the daemon died: {task.exception()!r}")
        self.loop.create_task(self._down(box, gone=True))

    async def crash(self, nid: str) -> None:
        """Power off nid: its daemon and worker die at once; the disk keeps what was synced."""
        await self._down(self.boxes[nid], gone=False)

    async def _down(self, box: Box, gone: bool) -> None:
        daemon = box.daemon
        if daemon is None:
            return
        box.daemon, box.task, box.paused = None, None, False
        self.net.detach(box.addr)
        daemon.transport.closed = True  # type: ignore[attr-defined]
        box.worker.kill()
        await self.loop.cancel_host(f"{box.node_id}#{box.lives}")
        daemon.store.close()
        box.gone = gone

    async def tear(self, nid: str, at: float) -> tuple[int, int]:
        """Power off nid in the middle of appending its next log entry: the write tears `at` that
        fraction of the bytes it may tear at (0: lost whole; at most up to TORN_ZEROS bytes from
        its end, as a disk cuts a write at a sector). Returns (the torn entry's index, the offset)."""
        box = self.boxes[nid]
        assert box.daemon is not None, f"{nid} is down"
        store = box.daemon.store
        entry = Entry(store.last_index + 1, max(store.current_term, store.last_term), EntryKind.KV_PUT,
                      {"key": "torn", "value": "x" * 48})
        offset = round(at * (len(torn_bytes(entry, 0)) - TORN_ZEROS))
        await self.crash(nid)
        tear(box.data_dir / "store", entry, offset)
        return entry.index, offset

    async def wipe(self, nid: str) -> None:
        """Power off nid and replace its disk (same node id, nothing on it)."""
        await self.crash(nid)
        shutil.rmtree(self.boxes[nid].data_dir, ignore_errors=True)

    def pause(self, nid: str) -> None:
        """SIGSTOP: the driver's loop stops and arrivals wait; its worker stalls its group."""
        box = self.boxes[nid]
        if box.daemon is None or box.paused:
            return
        box.paused = True
        self.net.pause(box.addr)
        if box.task is not None:
            box.task.cancel()  # the driver's loop; its other tasks wait on what it no longer does
        box.worker.kill()

    def resume(self, nid: str) -> None:
        """SIGCONT: the driver runs again and takes what arrived meanwhile."""
        box = self.boxes[nid]
        if box.daemon is None or not box.paused:
            return
        box.paused = False
        box.worker.start(self.loop.time())
        daemon = box.daemon
        box.task = self.loop.create_task(daemon.node.timers.run(), context=self.net.hosts[box.addr].context)
        box.task.add_done_callback(lambda t: self._ended(box, daemon, t))
        self.net.resume(box.addr)

    def crash_worker(self, nid: str) -> None:
        """The worker process alone dies; its supervisor restarts it after the backoff."""
        box = self.boxes[nid]
        if box.daemon is not None and box.worker.alive:
            box.worker.kill(self.loop.time())

    # -- network -------------------------------------------------------------------------------
    def cut(self, a: str, b: str, data_plane: bool = True) -> None:
        """Cut a -> b (one way); data_plane: the workers' collectives too (a real cut)."""
        self.links.block(a, b)
        if data_plane:
            self.data_cut.add((a, b))

    def heal(self) -> None:
        """Every cut mended (loss and delay stay)."""
        self.links.heal()
        self.data_cut.clear()

    # -- operators -----------------------------------------------------------------------------
    def client(self, nid: str, timeout: float = 10.0) -> MemoryClient:
        """An operator's client of nid (the operator reaches every box)."""
        return MemoryClient(self.net, OPERATOR, self.boxes[nid].addr, timeout)

    def up(self) -> list[str]:
        """Boxes whose daemon runs and is not paused, in id order."""
        return [n for n, b in self.boxes.items() if b.daemon is not None and not b.paused]

    async def ticker(self) -> None:
        """The workers' data plane, one tick per STEP_S."""
        while True:
            await asyncio.sleep(STEP_S)
            self.training.tick()

    async def close(self) -> None:
        """Power everything off and remove the disks."""
        for nid in list(self.boxes):
            await self.crash(nid)
        shutil.rmtree(self.root, ignore_errors=True)


def quiet_logs() -> None:
    """The daemons log at INFO on every change; a simulation of thousands of runs keeps errors only."""
    logging.getLogger("dpeer").setLevel(logging.CRITICAL)
