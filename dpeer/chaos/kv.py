"""The background kv writer (acknowledged `dpeer kv put`s during the run) and its read-back check."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TYPE_CHECKING

from dpeer import errors
from dpeer.launch.cluster import LocalNode
from dpeer.transport.client import NodeClient

if TYPE_CHECKING:
    from dpeer.chaos.run import Run


async def kv_writer(run: Run, stop: asyncio.Event) -> None:
    """Every `kv_every` seconds, put a fresh key through a random reachable node; keep the acknowledged."""
    i = 0
    while not stop.is_set():
        nodes = run.reachable()
        if nodes:
            node = run.kv_rng.choice(nodes)
            key, value = f"chaos-{run.opts.seed}-{i}", f"v{i}-{run.kv_rng.getrandbits(32):08x}"
            i += 1
            run.kv_attempts += 1
            if await _put(node, key, value) == 0:
                run.acked[key] = value
            else:
                run.kv_failed += 1
        try:
            await asyncio.wait_for(stop.wait(), run.opts.kv_every)
        except TimeoutError:
            pass


async def _put(node: LocalNode, key: str, value: str) -> int:
    """`dpeer kv put KEY VALUE` through `node`, as a user would; its exit code."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dpeer.cli.main", "kv", "put", key, value, "--addr", node.addr,
        "--timeout", "5", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("DPEER_")})
    try:
        return await asyncio.wait_for(proc.wait(), 30)
    except TimeoutError:
        proc.kill()
        return await proc.wait()


async def kv_check(run: Run) -> list[str]:
    """Every acknowledged write must read back with its value through every node."""
    problems = []
    for node in run.cluster.nodes:
        client = NodeClient(node.addr, channels=run.channels, timeout=10.0)
        for key, value in run.acked.items():
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
