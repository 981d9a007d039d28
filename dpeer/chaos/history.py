"""The kv history of a chaos run: concurrent clients put, get and delete a few keys through random
reachable nodes during the chaos window, then, once training has finished, every key is read
through every node; each operation is recorded with its invocation and answer times (seconds
since the run started, monotonic) for the linearizability check (dpeer/chaos/linear.py).

Each client has a seeded random stream of its own (which operation, which key, which node among
those reachable, the gap before its next operation) and at most one operation in flight, like a
user's `dpeer kv` call; it speaks through the client the CLI uses (NodeClient). A put writes a
value of its own ("c<client>-<n>"), so a read names the write it saw. An operation that gets no
answer (an error or a timeout) is recorded without one: for a write the outcome is unknown.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from dpeer import errors
from dpeer.chaos.linear import Kind, Op
from dpeer.launch.cluster import LocalNode
from dpeer.transport.client import NodeClient

if TYPE_CHECKING:
    from dpeer.chaos.run import Run

KEYS = 3
# A client's wait for an answer: short, as Jepsen's clients wait, so that a client does not sit
# out a whole partition on the node cut off. A write that timed out may still take effect (the
# daemon goes on trying for its own 10 s), which the check allows: it has no answer.
TIMEOUT = 3.0
MIX = ((0.40, Kind.PUT), (0.55, Kind.DELETE), (1.0, Kind.GET))  # cumulative shares of the draws


def key_name(seed: int, k: int) -> str:
    """The run's k-th register key."""
    return f"chaos-{seed}-r{k}"


async def kv_clients(run: Run, stop: asyncio.Event) -> None:
    """Run the run's clients until the chaos window is over (or `stop` is set); each finishes the
    operation it has in flight."""
    await asyncio.gather(*(_client(run, c, stop) for c in range(run.opts.kv_clients)))


async def _client(run: Run, c: int, stop: asyncio.Event) -> None:
    """One client: an operation, a seeded gap, the next; the draws come from its own stream."""
    rng = random.Random(run.opts.seed * 7919 + 101 + c)
    n = 0
    while not stop.is_set() and run.chaos_end is None:
        draw, key, pick = rng.random(), key_name(run.opts.seed, rng.randrange(KEYS)), rng.random()
        nodes = run.reachable()
        if nodes:
            kind = next(kind for share, kind in MIX if draw < share)
            node = nodes[int(pick * len(nodes)) % len(nodes)]
            run.history.append(await perform(run, c, node, kind, key, f"c{c}-{n}"))
            n += 1
        try:
            await asyncio.wait_for(stop.wait(), rng.uniform(0.5, 1.5) * run.opts.kv_op_every)
        except TimeoutError:
            pass


async def perform(run: Run, c: int, node: LocalNode, kind: Kind, key: str, value: str) -> Op:
    """One operation through `node`, timed from just before the call to just after the answer."""
    client = NodeClient(node.addr, channels=run.channels, timeout=TIMEOUT)
    written = value if kind is Kind.PUT else None
    call = run.now()
    try:
        if kind is Kind.PUT:
            await client.kv_put(key, value)
            return Op(c, kind, key, call, run.now(), value=value, node=node.node_id)
        if kind is Kind.DELETE:
            deleted = await client.kv_delete(key)
            return Op(c, kind, key, call, run.now(), found=deleted.found, node=node.node_id)
        read = await client.kv_get(key)
        return Op(c, kind, key, call, run.now(), value=read.value if read.found else None, node=node.node_id)
    except errors.PeerError:
        return Op(c, kind, key, call, None, value=written, node=node.node_id)


def window_counts(history: list[Op], clients: int) -> tuple[int, int]:
    """The chaos window's operations (those of clients below `clients`; the end-of-run reads are
    client `clients`): how many were sent and how many answered."""
    window = [op for op in history if op.client < clients]
    return len(window), sum(op.ret is not None for op in window)


async def final_reads(run: Run) -> None:
    """Read every key through every running node once the faults are over (client number
    `kv_clients`): the end state joins the history the check judges."""
    for k in range(KEYS):
        for node in run.cluster.nodes:
            if node.running:
                run.history.append(await perform(run, run.opts.kv_clients, node, Kind.GET,
                                                 key_name(run.opts.seed, k), ""))
