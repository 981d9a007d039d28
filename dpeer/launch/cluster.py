"""A local cluster of real `dpeer start` processes on loopback: for the demo, chaos runs and tests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dpeer import errors
from dpeer.transport.client import NodeClient
from dpeer.transport.options import Security


def free_port_block(count: int, start: int | None = None, stop: int = 60000) -> int:
    """The first port p >= start such that p..p+2*count-1 are all free on 127.0.0.1.

    Node i listens on p + 2i and its worker's rendezvous store on p + 2i + 1. The default start
    depends on the process id, so concurrent test runs rarely race for the same ports.
    """
    port = start if start is not None else 20000 + (os.getpid() * 7919) % 30000
    while port + 2 * count < stop:
        if all(_free(p) for p in range(port, port + 2 * count)):
            return port
        port += 2 * count
    raise OSError("no block of free ports on 127.0.0.1")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class LocalNode:
    """One daemon of the cluster: its identity, address, data dir and process."""

    node_id: str
    port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen | None = None
    starts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"
    prefix: list[str] = field(default_factory=list)  # what runs the daemon elsewhere (a network namespace)
    flags: list[str] = field(default_factory=list)  # more `dpeer start` flags of this node alone (its --site)

    @property
    def addr(self) -> str:
        """HOST:PORT of its gRPC server."""
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """True while its process lives."""
        return self.proc is not None and self.proc.poll() is None


class LocalCluster:
    """Starts, kills, pauses and restarts daemons; every process it ends is one it started."""

    def __init__(
        self, root: Path, size: int, *, job: str | None = None, base_port: int | None = None,
        config: dict[str, Any] | None = None, env: dict[str, str] | None = None,
        entry: tuple[str, ...] = ("dpeer.cli.main", "start"),
        placement: Callable[[int], tuple[str, list[str]]] | None = None,
    ) -> None:
        """entry: the module (and subcommand) each daemon runs, `python -m ENTRY --node-id ...`;
        the chaos tool runs its own (dpeer.chaos.daemon, which installs its faults).
        placement: node number (1..size) -> (host it listens on, command prefix that starts it
        there); default every node on 127.0.0.1, started directly (`dpeer chaos --netns` puts
        each in a network namespace of its own, dpeer/chaos/netns.py)."""
        self.root = root
        self.entry = entry
        self.job = job
        self.config = config or {}
        self.env = env or {}
        base = base_port or free_port_block(size)
        self.nodes = [
            LocalNode(f"n{i + 1}", base + 2 * i, root / f"n{i + 1}", root / f"n{i + 1}.log") for i in range(size)
        ]
        for i, node in enumerate(self.nodes, 1):
            if placement is not None:
                node.host, node.prefix = placement(i)
        root.mkdir(parents=True, exist_ok=True)

    def node(self, node_id: str) -> LocalNode:
        """The node named node_id."""
        return next(n for n in self.nodes if n.node_id == node_id)

    def _config_file(self) -> Path | None:
        if not self.config:
            return None
        import yaml

        path = self.root / "dpeer.yaml"
        path.write_text(yaml.safe_dump(self.config))
        return path

    def start(self, node: LocalNode, join: list[str] | None = None) -> None:
        """Start node's daemon, joining through `join` (default: every other node)."""
        if node.running:
            raise RuntimeError(f"{node.node_id} is already running")
        peers = join if join is not None else [n.addr for n in self.nodes if n is not node]
        cmd = [*node.prefix, sys.executable, "-m", *self.entry, "--node-id", node.node_id,
               "--listen", node.addr, "--data-dir", str(node.data_dir)]
        if peers:
            cmd += ["--join", ",".join(peers)]
        if self.job:
            cmd += ["--job", self.job]
        cmd += node.flags
        conf = self._config_file()
        if conf is not None:
            cmd += ["--config", str(conf)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        log = open(node.log_path, "ab")
        node.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        node.starts += 1

    def start_all(self) -> None:
        """Start the first node as the founder, then the others joining through it."""
        first, *rest = self.nodes
        self.start(first, join=[])
        for node in rest:
            self.start(node)

    def kill(self, node: LocalNode, sig: int = signal.SIGKILL, wait: bool = True) -> None:
        """Send sig to the node's daemon (and its worker, by process group); on SIGKILL/SIGTERM reap
        it (SIGKILL after 60 s of a SIGTERM) unless `wait` is false."""
        if node.proc is None:
            return
        try:
            os.killpg(node.proc.pid, sig)
        except ProcessLookupError:
            pass
        if wait and sig in (signal.SIGKILL, signal.SIGTERM):
            try:
                node.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(node.proc.pid, signal.SIGKILL)
                node.proc.wait(timeout=30)

    def stop_all(self) -> None:
        """SIGKILL every daemon still running (tests end here, whatever happened)."""
        for node in self.nodes:
            if node.running:
                self.kill(node, signal.SIGKILL)

    async def status(self, node: LocalNode, timeout: float = 2.0) -> dict[str, Any] | None:
        """The node's status document, or None when it does not answer."""
        try:
            async with NodeClient(node.addr, Security(), timeout=timeout) as client:
                return json.loads((await client.status()).json)
        except errors.PeerError:
            return None

    async def statuses(self, timeout: float = 2.0) -> dict[str, dict[str, Any] | None]:
        """Every running node's status (None for those that do not answer)."""
        running = [n for n in self.nodes if n.running]
        docs = await asyncio.gather(*(self.status(n, timeout) for n in running))
        return {n.node_id: d for n, d in zip(running, docs)}

    async def wait_for(self, predicate: Any, timeout: float, what: str, interval: float = 0.05) -> dict:
        """Poll statuses until predicate(statuses) is true; TimeoutError naming `what` otherwise."""
        deadline = time.monotonic() + timeout
        last: dict = {}
        while time.monotonic() < deadline:
            last = await self.statuses()
            if predicate(last):
                return last
            await asyncio.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; last statuses: {json.dumps(last)[:2000]}")

    def tail(self, node: LocalNode, lines: int = 30) -> str:
        """The end of a node's log, for failure messages."""
        if not node.log_path.exists():
            return ""
        return "\n".join(node.log_path.read_text(errors="replace").splitlines()[-lines:])
