"""The data dir stays bounded (issue 37): daemons train the demo job while a loop writes kv pairs;
every ``--every`` seconds each data dir's size, part by part, is printed against its bound
(docs/operations.md, "What a data dir holds"), and at the end the ledgers, folded as they are,
are audited up to the step every box committed.

The bound of one data dir, in allocated bytes (what ``du`` counts; 4 KiB blocks):
- store: the Raft log keeps at most snapshot_every + snapshot_keep (11,000) entries, then it is
  compacted into a snapshot; LMDB's file holds its high-water mark, at most twice what the
  entries and two snapshots of the state take (copy-on-write pages, half-full B-tree pages);
- checkpoints: the two newest, the committed one and one being written: 4 checkpoints;
- ledger: at most the last 2 x checkpoint_every steps in full (a fold at each checkpoint keeps
  those since the committed checkpoint, or since the previous one when the commit lags), 320
  bytes and one index per sample of the global batch a step at most, plus the folded head:
  0.3 KB and one step's records a generation, 0.1 KB a digest kept (one a checkpoint and one a
  generation, at most DIGESTS_KEPT); twice that while a fold rewrites it (the old file and the
  new one are both on disk until the rename);
- reports: the live file and REPORTS_KEPT sealed ones, REPORTS_ROTATE_BYTES and a record each;
- views: VIEWS_KEPT files; other: checkpoint.json, final.pt (a checkpoint's size), the socket.

Usage: ``python scripts/soak.py [--minutes 20] [--nodes 3] [--checkpoint-every 200]
[--kv-per-s 2] [--every 60] [--dir DIR] [--json FILE]``; ``--steps N`` stops once every box
passed step N instead. Exits 1 when a data dir went over its bound or the audit found a problem.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpeer import errors  # noqa: E402
from dpeer.channel import local  # noqa: E402
from dpeer.daemon.node.driver import Node  # noqa: E402
from dpeer.launch.cluster import LocalCluster  # noqa: E402
from dpeer.trainer.ledger import DIGESTS_KEPT  # noqa: E402
from dpeer.transport.client import NodeClient  # noqa: E402
from dpeer.transport.options import Security  # noqa: E402

BLOCK = 4096
PARTS = ("store", "checkpoints", "ledger", "reports", "views", "other")
KV_KEYS, KV_VALUE = 64, 200  # the loop cycles through 64 keys, 200-character values
CHECKPOINTS_HELD = 4  # the two newest (trainer.loop.LoopConfig.ckpt_keep), the committed one, one being written
_NODE = inspect.signature(Node.__init__).parameters
LOG_ENTRIES = _NODE["snapshot_every"].default + _NODE["snapshot_keep"].default


@dataclass(frozen=True)
class Shape:
    """What the bound depends on: the run's shape and what the soak writes."""

    checkpoint_every: int
    global_batch: int
    dataset_len: int
    entry_bytes: int  # the largest log entry the cluster writes
    state_bytes: int  # the applied state's snapshot: the kv data and the members


def blocks(n: int) -> int:
    """n bytes as the 4 KiB blocks a file of that size takes."""
    return -(-n // BLOCK) * BLOCK


def part_of(rel: Path) -> str:
    """Which part of a data dir a file (relative to it) belongs to."""
    top = rel.parts[0]
    if top in ("store", "checkpoints"):
        return top
    name = rel.name
    if top == "worker" and name.startswith("ledger.jsonl"):
        return "ledger"
    if top == "worker" and len(rel.parts) > 1 and rel.parts[1] in ("reports", "views"):
        return rel.parts[1]
    return "other"


def sizes(data_dir: Path) -> dict[str, int]:
    """Allocated bytes of each part of a data dir (st_blocks, as du counts them)."""
    out = dict.fromkeys(PARTS, 0)
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            path = Path(root) / name
            try:
                out[part_of(path.relative_to(data_dir))] += path.lstat().st_blocks * 512
            except FileNotFoundError:
                continue  # renamed or pruned while this walked
    return out


def bound(shape: Shape, step: int, generation: int, checkpoint_bytes: int) -> dict[str, int]:
    """The most each part of a data dir may hold at `step` after `generation` generations."""
    step_bytes = 320 + (len(str(shape.dataset_len)) + 2) * shape.global_batch
    every = shape.checkpoint_every
    digests = min(DIGESTS_KEPT, step // every + generation + 1)  # a checkpoint's and a group's first
    ledger = 2 * every * step_bytes + generation * (300 + step_bytes) + 100 * digests
    ckpt = blocks(checkpoint_bytes)
    return {
        "store": 2 * (LOG_ENTRIES * shape.entry_bytes + 2 * shape.state_bytes),
        "checkpoints": CHECKPOINTS_HELD * ckpt,
        "ledger": 2 * blocks(ledger),  # the old file and the fold's new one, until its rename
        "reports": (local.REPORTS_KEPT + 1) * blocks(local.REPORTS_ROTATE_BYTES + 4096),
        "views": local.VIEWS_KEPT * BLOCK,
        "other": ckpt + 4 * BLOCK,
    }


def newest_checkpoint_bytes(data_dir: Path) -> int:
    """The size of the newest checkpoint file (the model and optimizer state), 0 before the first."""
    files = sorted((data_dir / "checkpoints").glob("ckpt-*.bin"))
    return files[-1].stat().st_size if files else 0


class KvLoop:
    """Writes kv pairs at a steady rate, one node after another over a client each kept open,
    counting the writes (a refused one is counted apart and tried on the next node)."""

    def __init__(self, cluster: LocalCluster, per_s: float) -> None:
        self.cluster, self.per_s, self.puts, self.failed = cluster, per_s, 0, 0

    async def run(self, stop: asyncio.Event) -> None:
        """Put until `stop` is set."""
        clients = [NodeClient(n.addr, Security(), timeout=5.0) for n in self.cluster.nodes]
        try:
            tick = time.monotonic()
            while not stop.is_set():
                client = clients[(self.puts + self.failed) % len(clients)]
                try:
                    await client.kv_put(f"soak/{self.puts % KV_KEYS}", str(self.puts).rjust(KV_VALUE, "x"))
                    self.puts += 1
                except errors.PeerError:
                    self.failed += 1
                tick += 1.0 / self.per_s
                try:
                    await asyncio.wait_for(stop.wait(), max(0.0, tick - time.monotonic()))
                except TimeoutError:
                    pass
        finally:
            for client in clients:
                await client.__aexit__(None, None, None)


def sample(cluster: LocalCluster, docs: dict[str, Any], shape: Shape, elapsed: float, puts: int) -> dict[str, Any]:
    """One row: per node, its step, generation, sizes and bound."""
    row: dict[str, Any] = {"t": round(elapsed), "kv_puts": puts, "nodes": {}}
    for node in cluster.nodes:
        doc = docs.get(node.node_id) or {}
        step = ((doc.get("train") or {}).get("latest_step")) or 0
        generation = ((doc.get("group") or {}).get("generation")) or 0
        have = sizes(node.data_dir)
        limit = bound(shape, step, generation, newest_checkpoint_bytes(node.data_dir))
        row["nodes"][node.node_id] = {"step": step, "generation": generation, "sizes": have, "bound": limit,
                                      "over": [p for p in PARTS if have[p] > limit[p]],
                                      "total": sum(have.values()), "total_bound": sum(limit.values())}
    return row


def print_row(row: dict[str, Any]) -> None:
    """The row as text: per node, the total against the bound and the parts in KiB."""
    for name, n in row["nodes"].items():
        parts = " ".join(f"{p} {n['sizes'][p] // 1024}/{n['bound'][p] // 1024}" for p in PARTS)
        flag = f"  OVER: {', '.join(n['over'])}" if n["over"] else ""
        print(f"{row['t']:>6}s {name} step {n['step']:>6} gen {n['generation']:>3} kv {row['kv_puts']:>6}  "
              f"{n['total'] / 1e6:6.2f} MB of {n['total_bound'] / 1e6:6.2f} MB  (KiB: {parts}){flag}", flush=True)


def audit_now(cluster: LocalCluster, shape: Shape, micro_batch: int, seed: int) -> list[str]:
    """The ledgers as they are (folded heads, full tails), audited below the step every box committed."""
    from dpeer.trainer.audit import audit, read_ledger, read_records  # torch-free, but the trainer's
    from dpeer.trainer.sampler import GlobalBatchSampler

    paths = {n.node_id: str(n.data_dir / "worker" / "ledger.jsonl") for n in cluster.nodes}
    upto = min(max((e["step"] for e in read_ledger(p)), default=-1) for p in paths.values()) + 1
    ledgers = {n: read_records(p) for n, p in paths.items()}
    sampler = GlobalBatchSampler(shape.dataset_len, shape.global_batch, seed)
    return audit(ledgers, upto, sampler, micro_batch)


async def soak(root: Path, nodes: int, minutes: float, steps: int | None, checkpoint_every: int, kv_per_s: float,
               every: float, training: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the soak; the rows sampled, the audit's problems and whether every sample kept its bound."""
    from dpeer.trainer.demo import DEFAULTS

    config = {"training": {"steps": 10**9, "checkpoint_every": checkpoint_every, **(training or {})}}
    t = config["training"]
    batch = int(t.get("global_batch", DEFAULTS["global_batch"]))
    shape = Shape(checkpoint_every, batch, int(DEFAULTS["dataset_len"]), entry_bytes=KV_VALUE + 512,
                  state_bytes=KV_KEYS * (KV_VALUE + 64) + nodes * 4096)
    cluster = LocalCluster(root, nodes, job="demo", config=config, env={"OMP_NUM_THREADS": "1"})
    rows: list[dict[str, Any]] = []
    stop = asyncio.Event()
    kv = KvLoop(cluster, kv_per_s)
    try:
        cluster.start_all()
        await cluster.wait_for(lambda d: all(((x or {}).get("train") or {}).get("latest_step", 0) > 0 for x in d.values())
                               and len(d) == nodes, 300, "every box training")
        started = time.monotonic()
        writer = asyncio.create_task(kv.run(stop))
        next_sample = started
        while True:
            now = time.monotonic()
            docs = await cluster.statuses(timeout=5.0)
            if now >= next_sample:
                rows.append(sample(cluster, docs, shape, now - started, kv.puts))
                print_row(rows[-1])
                next_sample += every
            done = [((d or {}).get("train") or {}).get("latest_step", 0) for d in docs.values()]
            if (steps is not None and len(done) == nodes and min(done) >= steps) or \
                    (steps is None and now - started >= minutes * 60):
                break
            dead = [n.node_id for n in cluster.nodes if not n.running]
            if dead:
                raise RuntimeError(f"{dead} exited: {cluster.tail(cluster.node(dead[0]))}")
            await asyncio.sleep(min(1.0, max(0.05, next_sample - time.monotonic())))
        stop.set()
        await writer
        rows.append(sample(cluster, await cluster.statuses(timeout=5.0), shape, time.monotonic() - started, kv.puts))
        print_row(rows[-1])
        problems = audit_now(cluster, shape, int(t.get("micro_batch", DEFAULTS["micro_batch"])),
                             int(t.get("seed", DEFAULTS["seed"])))
    finally:
        stop.set()
        cluster.stop_all()
    within = all(not n["over"] for row in rows for n in row["nodes"].values())
    return {"rows": rows, "kv_puts": kv.puts, "kv_failed": kv.failed, "audit_problems": problems, "within": within,
            "load_average": os.getloadavg()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--steps", type=int, default=None, help="stop once every box passed this step instead")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--kv-per-s", type=float, default=2.0)
    p.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    p.add_argument("--dir", type=Path, default=None, help="data dirs go here (default: a temp dir, removed)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.minutes <= 0 or args.nodes < 1 or args.checkpoint_every < 1 or args.kv_per_s <= 0 or args.every <= 0:
        p.error("--minutes, --nodes, --checkpoint-every, --kv-per-s and --every must be positive")
    root = args.dir or Path(tempfile.mkdtemp(prefix="dpeer-soak-"))
    print(f"soak: {args.nodes} daemons, the demo job, checkpoint_every {args.checkpoint_every}, "
          f"{args.kv_per_s:g} kv puts/s; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    try:
        result = asyncio.run(soak(root / "cluster", args.nodes, args.minutes, args.steps, args.checkpoint_every,
                                  args.kv_per_s, args.every))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"kv puts {result['kv_puts']} ({result['kv_failed']} refused); load average at the end "
          f"{' '.join(f'{x:.1f}' for x in result['load_average'])}")
    print(f"audit of the folded ledgers: {'clean' if not result['audit_problems'] else result['audit_problems'][:5]}")
    print(f"every data dir within its bound: {'yes' if result['within'] else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if result["within"] and not result["audit_problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
