"""Real `dpeer` processes on 127.0.0.1 driven through the CLI, as a user drives them: the
daemons a test starts (Daemons), CLI calls, and waits on their status documents.

Every daemon a test starts is a process of its own session; tests/operate/conftest.py's
`daemons` fixture SIGKILLs exactly those PIDs at the end and prints their logs on failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from dpeer import errors
from dpeer.launch.cluster import free_port_block
from dpeer.daemon.config import NodeConfig
from dpeer.transport.client import NodeClient
from dpeer.transport.options import Security

DPEER = [sys.executable, "-m", "dpeer.cli.main"]
WAIT = 60.0  # bound on any wait for a cluster to form or settle (the machine is shared and slow)
DEFAULT_MAX_VOTERS = NodeConfig.model_fields["max_voters"].default


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `dpeer ARGS...` as an operator would and return its exit code, stdout and stderr."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DPEER_") or k == "DPEER_SLOW"}
    full_env.update(env or {})
    return subprocess.run([*DPEER, *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)


def cli_many(commands: Sequence[Sequence[str]], env: dict[str, str] | None = None,
             timeout: float = 90.0) -> list[subprocess.CompletedProcess]:
    """Run several CLI invocations at once (each start pays Python's and grpc's import cost)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DPEER_") or k == "DPEER_SLOW"}
    full_env.update(env or {})
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
class Daemon:
    """One `dpeer start` process."""

    node_id: str
    addr: str
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen

    @property
    def running(self) -> bool:
        """True while the process lives."""
        return self.proc.poll() is None

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
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_exit(self, timeout: float = WAIT) -> int:
        """Wait for the process to end on its own; its exit code."""
        return self.proc.wait(timeout=timeout)


class Daemons:
    """Starts `dpeer start` processes and ends exactly those, by PID."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[Daemon] = []
        self._ports = free_port_block(8, start=21000 + (os.getpid() % 200) * 100)
        self._next = 0

    def port(self) -> int:
        """A port of this test's free block (gRPC listen ports, metrics ports)."""
        port = self._ports + self._next
        self._next += 1
        if self._next >= 16:
            raise RuntimeError("the test used up its block of ports")
        return port

    def start(self, node_id: str, *, join: Sequence[str] = (), config: Path | None = None,
              env: dict[str, str] | None = None, extra: Sequence[str] = (), listen: str | None = None) -> Daemon:
        """Start a daemon on 127.0.0.1 (a port of the block unless listen is given)."""
        addr = listen or f"127.0.0.1:{self.port()}"
        data_dir = self.root / node_id
        log_path = self.root / f"{node_id}.log"
        cmd = [*DPEER, "start", "--node-id", node_id, "--listen", addr, "--data-dir", str(data_dir), *extra]
        if join:
            cmd += ["--join", ",".join(join)]
        if config is not None:
            cmd += ["--config", str(config)]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("DPEER_") or k == "DPEER_SLOW"}
        full_env.update({"PYTHONUNBUFFERED": "1", **(env or {})})
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
        daemon = Daemon(node_id, addr, data_dir, log_path, proc)
        self.started.append(daemon)
        return daemon

    def signal(self, daemon: Daemon, sig: int) -> None:
        """Send sig to the daemon's process (only ever one this fixture started)."""
        if daemon.running:
            os.kill(daemon.proc.pid, sig)

    def kill_all(self) -> None:
        """SIGKILL every daemon still running, by its PID, and reap it."""
        for daemon in self.started:
            if daemon.running:
                try:
                    os.kill(daemon.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                daemon.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


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
