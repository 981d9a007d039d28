"""Driving a LocalCluster from plain test functions: run a coroutine, wait for a formed cluster,
force a reconfiguration once the guard allows it."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

from dpeer.launch.cluster import LocalCluster
from tests.support.daemons import DEFAULT_MAX_VOTERS, cli

TIMEOUT = 60.0  # bound on a cluster's forming or settling


def run(coro: Any) -> Any:
    """Run one coroutine to completion (tests stay plain functions)."""
    return asyncio.run(coro)


def states_by(docs: dict, observer: str) -> dict[str, str]:
    return {m["node_id"]: m["state"] for m in docs[observer]["members"]}


async def formed(cluster: LocalCluster, size: int) -> dict:
    """Wait until every running node sees `size` alive members, one shared leader, a group of
    `size` and the voters filled up to the default cap (the leader may commit the group first)."""
    def ok(docs: dict) -> bool:
        live = [d for d in docs.values() if d is not None]
        if len(live) != len([n for n in cluster.nodes if n.running]):
            return False
        leaders = {d["leader"] for d in live}
        return (len(leaders) == 1 and None not in leaders
                and all(sum(m["state"] == "alive" for m in d["members"]) == size for d in live)
                and all(d["group"] is not None and d["group"]["world_size"] == size for d in live)
                and all(len(d["voters"]) == min(size, DEFAULT_MAX_VOTERS) for d in live))
    return await cluster.wait_for(ok, TIMEOUT, f"{size} members with one leader")


async def force_when_allowed(addr: str, voters: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    """Run `dpeer force` until the guard lets it through (no leader for 2 x the longest election
    timeout: 24 s on lan); every refusal on the way must be that wait, nothing else."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        forced = cli("force", "--addr", addr, "--voters", voters, "--yes")
        if forced.returncode == 0:
            return forced
        assert forced.returncode == 1 and "a leader was known" in forced.stderr, forced.stderr
        assert asyncio.get_running_loop().time() < deadline, forced.stderr
        await asyncio.sleep(2.0)
