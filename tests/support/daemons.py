"""The tests' one harness of real `dpeer` processes on 127.0.0.1: the daemons a test starts,
signals, kills, restarts and reads (Daemons, a LocalCluster with daemons of its own), CLI calls
as a user makes them, and waits on status documents.

Every daemon is a process of its own session; the `daemons` and `make_cluster` fixtures
(tests/operate/conftest.py, tests/integration/conftest.py) SIGKILL exactly those at the end and
print their logs on failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from dpeer import errors
from dpeer.launch.cluster import LocalCluster, LocalNode, free_port_block
from dpeer.daemon.config import NodeConfig
from dpeer.transport.client import NodeClient
from dpeer.transport.options import Security

DPEER = [sys.executable, "-m", "dpeer.cli.main"]
WAIT = 60.0  # bound on any wait for a cluster to form or settle (the machine is shared and slow)
DEFAULT_MAX_VOTERS = NodeConfig.model_fields["max_voters"].default


def clean_env() -> dict[str, str]:
    """This process's environment without its DPEER_ variables (DPEER_SLOW stays)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DPEER_") or k == "DPEER_SLOW"}


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `dpeer ARGS...` as an operator would and return its exit code, stdout and stderr."""
    return subprocess.run([*DPEER, *args], capture_output=True, text=True, timeout=timeout,
                          env={**clean_env(), **(env or {})}, cwd=cwd)


def cli_many(commands: Sequence[Sequence[str]], env: dict[str, str] | None = None,
             timeout: float = 90.0) -> list[subprocess.CompletedProcess]:
    """Run several CLI invocations at once (each start pays Python's and grpc's import cost)."""
    full_env = {**clean_env(), **(env or {})}
    procs = [subprocess.Popen([*DPEER, *c], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
             for c in commands]
    out = []
    deadline = time.monotonic() + timeout
    for cmd, proc in zip(commands, procs):
        try:
            stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            raise
        out.append(subprocess.CompletedProcess([*DPEER, *cmd], proc.returncode, stdout, stderr))
    return out


def one_sentence(stderr: str) -> str:
    """The single non-empty stderr line of a failed command, asserting there is exactly one and no traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {stderr!r}"
    assert "Traceback" not in stderr, stderr
    assert lines[0].startswith("dpeer: "), lines[0]
    return lines[0]


@dataclass
class Daemon(LocalNode):
    """One `dpeer start` process of a Daemons: a LocalNode with its own config file and
    environment (kept for its restarts), and its log."""

    config: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def log_lines(self) -> list[dict[str, Any]]:
        """The daemon's JSON log lines (lines that are not JSON are skipped)."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out

    def tail(self, lines: int = 40) -> str:
        """The end of its log, for failure messages."""
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_exit(self, timeout: float = WAIT) -> int:
        """Wait for the process to end on its own; its exit code."""
        assert self.proc is not None, f"{self.node_id} was never started"
        return self.proc.wait(timeout=timeout)


class Daemons(LocalCluster):
    """The tests' real-process harness: starts, signals, kills and restarts `dpeer start` daemons
    on 127.0.0.1 and reads their status; every process it ends is one it started.

    Daemons(root, size, job=..., config={...}) lays out a LocalCluster of n1..nSIZE (start_all
    forms it); start("n4", ...) adds a daemon of its own (config file, environment, flags, port of
    this test's block) at any time. Daemons run without the runner's DPEER_ variables (but
    DPEER_SLOW), so only what a test passes configures them.
    """

    def __init__(self, root: Path, size: int = 0, **kwargs: Any) -> None:
        super().__init__(root, size, **kwargs)
        self.nodes: list[Daemon] = [Daemon(n.node_id, n.port, n.data_dir, n.log_path, host=n.host, prefix=n.prefix)
                                    for n in self.nodes]
        self._ports: int | None = None
        self._next = 0

    def port(self) -> int:
        """A port of this test's free block (gRPC listen ports, metrics ports)."""
        if self._ports is None:
            self._ports = free_port_block(8, start=21000 + (os.getpid() % 200) * 100)
        port = self._ports + self._next
        self._next += 1
        if self._next >= 16:
            raise RuntimeError("the test used up its block of ports")
        return port

    def start(self, node: Daemon | str, join: Sequence[str] | None = None, *, config: Path | None = None,
              env: dict[str, str] | None = None, extra: Sequence[str] = (), listen: str | None = None) -> Daemon:
        """Start a daemon: one of ours again (as first started), or a new one named `node` on
        `listen` (default a port of the block) with its config file, environment and flags.
        join: addresses to join through; default every other node of ours for one of ours, none
        for a new one."""
        if isinstance(node, str):
            host, _, port = (listen or f"127.0.0.1:{self.port()}").rpartition(":")
            node = Daemon(node, int(port), self.root / node, self.root / f"{node}.log", host=host,
                          flags=list(extra), config=config, env=dict(env or {}))
            self.nodes.append(node)
            join = join or []
        if node.running:
            raise RuntimeError(f"{node.node_id} is already running")
        peers = join if join is not None else [n.addr for n in self.nodes if n is not node]
        cmd = [*node.prefix, sys.executable, "-m", *self.entry, "--node-id", node.node_id,
               "--listen", node.addr, "--data-dir", str(node.data_dir), *node.flags]
        if peers:
            cmd += ["--join", ",".join(peers)]
        if self.job:
            cmd += ["--job", self.job]
        conf = node.config or self._config_file()
        if conf is not None:
            cmd += ["--config", str(conf)]
        full_env = {**clean_env(), "PYTHONUNBUFFERED": "1", **self.env, **node.env}
        with open(node.log_path, "ab") as log:
            node.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                         start_new_session=True)
        node.starts += 1
        return node

    def signal(self, daemon: Daemon, sig: int) -> None:
        """Send sig to the daemon's process alone (kill() signals its process group, worker too)."""
        if daemon.running:
            os.kill(daemon.proc.pid, sig)

    async def formed(self, size: int) -> dict:
        """Wait until every running daemon sees `size` alive members, one shared leader, a group
        of `size` and the voters filled up to the default cap (the leader may commit the group
        first); the statuses."""
        def ok(docs: dict) -> bool:
            live = [d for d in docs.values() if d is not None]
            if len(live) != len([n for n in self.nodes if n.running]):
                return False
            leaders = {d["leader"] for d in live}
            return (len(leaders) == 1 and None not in leaders
                    and all(sum(m["state"] == "alive" for m in d["members"]) == size for d in live)
                    and all(d["group"] is not None and d["group"]["world_size"] == size for d in live)
                    and all(len(d["voters"]) == min(size, DEFAULT_MAX_VOTERS) for d in live))
        return await self.wait_for(ok, WAIT, f"{size} members with one leader")


def tear_down(made: list[Daemons], failed: bool) -> None:
    """A test's end: SIGKILL every daemon of `made` still running; print their logs if it failed."""
    for harness in made:
        harness.stop_all()
    for daemon in (d for harness in made for d in harness.nodes if failed and d.proc is not None):
        print(f"--- log of {daemon.node_id} ({daemon.addr}), exit {daemon.proc.returncode} ---")
        print(daemon.tail(60))


def run(coro: Any) -> Any:
    """Run one coroutine to completion (tests stay plain functions)."""
    return asyncio.run(coro)


def states_by(docs: dict, observer: str) -> dict[str, str]:
    """Each member's gossip state as `observer`'s status document shows it."""
    return {m["node_id"]: m["state"] for m in docs[observer]["members"]}


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


async def status_of(addr: str, security: Security | None = None, timeout: float = 3.0) -> dict[str, Any] | None:
    """A node's status document, or None when it does not answer."""
    try:
        async with NodeClient(addr, security or Security(), timeout=timeout) as client:
            return json.loads((await client.status()).json)
    except errors.PeerError:
        return None


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll predicate until it returns something truthy (returned); AssertionError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {str(last)[:1500]})")


def wait_status(addr: str, predicate: Callable[[dict[str, Any]], bool], what: str, timeout: float = WAIT,
                security: Security | None = None) -> dict[str, Any]:
    """Poll addr's status until predicate(doc) holds; the document."""
    last: dict[str, Any] | None = None

    def check() -> dict[str, Any] | None:
        nonlocal last
        last = asyncio.run(status_of(addr, security))
        return last if last is not None and predicate(last) else None

    try:
        return wait_until(check, timeout, what, interval=0.1)
    except AssertionError:
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last status: "
                             f"{json.dumps(last)[:2000]}") from None


def alive_ids(doc: dict[str, Any]) -> set[str]:
    """Node ids this status document sees alive."""
    return {m["node_id"] for m in doc["members"] if m["state"] == "alive"}


def formed(addr: str, node_ids: set[str], security: Security | None = None, timeout: float = WAIT) -> dict[str, Any]:
    """Wait until addr sees exactly node_ids alive and committed active, a leader, a group of them
    and the voters filled up to the default cap (the leader may commit the group first)."""
    def ok(doc: dict[str, Any]) -> bool:
        active = {m["node_id"] for m in doc["members"] if m.get("committed") == "active"}
        return (alive_ids(doc) == node_ids and active == node_ids and doc["leader"] is not None
                and doc["group"] is not None and set(doc["group"]["members"]) == node_ids
                and len(doc["voters"]) == min(len(node_ids), DEFAULT_MAX_VOTERS))
    return wait_status(addr, ok, f"{sorted(node_ids)} formed as seen from {addr}", timeout, security)
