"""Every node's committed log at the end of a run, read with `dpeer log --json` as an operator
would, then compared pairwise (dpeer/chaos/prefix.py)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import TYPE_CHECKING

from dpeer.chaos.prefix import NodeLog, PrefixResult, compare_logs, parse_log
from dpeer.launch.cluster import LocalNode

if TYPE_CHECKING:
    from dpeer.chaos.run import Run

ATTEMPTS = 3  # a node compacting its log while it is read answers "behind" once: read again


async def check_prefixes(run: Run) -> PrefixResult:
    """Read every node's committed log and compare them; a node not running counts as unread."""
    logs: list[NodeLog] = []
    unread: dict[str, str] = {}
    for node in run.cluster.nodes:
        if not node.running:
            unread[node.node_id] = "the node is not running"
            continue
        got = await read_log(node)
        if isinstance(got, NodeLog):
            logs.append(got)
        else:
            unread[node.node_id] = got
    return compare_logs(logs, unread)


async def read_log(node: LocalNode) -> NodeLog | str:
    """The node's log by `dpeer log --json --addr NODE`, or why it could not be read."""
    why = ""
    for _ in range(ATTEMPTS):
        code, out, err = await _dpeer_log(node)
        if code == 0:
            try:
                return parse_log(node.node_id, out)
            except (ValueError, KeyError) as exc:
                why = f"`dpeer log` printed what does not parse: {exc}"
        else:
            why = f"`dpeer log` exited {code}: {err.strip()[-300:]}"
        await asyncio.sleep(1.0)
    return why


async def _dpeer_log(node: LocalNode) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dpeer.cli.main", "log", "--json", "--addr", node.addr, "--timeout", "30",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if not k.startswith("DPEER_")})
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, "", "no answer within 120 s"
    return proc.returncode or 0, out.decode(), err.decode()
