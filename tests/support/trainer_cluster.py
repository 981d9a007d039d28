"""Multi-process test harness: worker processes on 127.0.0.1 and a fake view authority that plays
the daemons' part over a ``DirViewSource`` directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from dpeer.address import Address
from dpeer.trainer.viewsource import Assignment, View, publish_view, read_reports

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Cluster:
    """Workers plus an authority thread: it publishes a view of the live, ready nodes whenever that
    set differs from the current view or a member reports a failure of the current generation.
    ``{node}`` in an extra argument is replaced by the worker's node id."""

    def __init__(self, root: str, nodes: list[str], job_opts: dict[str, object], extra_args: list[str] | None = None):
        self.root = root
        self.views = os.path.join(root, "views-dir")
        self.nodes = nodes
        self.ports = dict(zip(nodes, free_ports(len(nodes))))
        self.job_opts = job_opts
        self.extra_args = extra_args or []
        self.procs: dict[str, subprocess.Popen] = {}
        self.live: set[str] = set()
        self.view: View | None = None
        self.views_published: list[tuple[float, View]] = []
        self.checkpoint: tuple[int, str] = (0, "")  # the committed checkpoint the views carry
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._authority, daemon=True)
        os.makedirs(self.views, exist_ok=True)

    def ledger(self, node: str) -> str:
        return os.path.join(self.root, f"ledger-{node}.jsonl")

    def final(self, node: str) -> str:
        return os.path.join(self.root, f"final-{node}.pt")

    def start(self, node: str) -> float:
        """Spawn the worker of ``node`` and mark it live; returns the spawn time."""
        args = [sys.executable, "-m", "dpeer.trainer.worker", "--node-id", node, "--job", "demo",
                "--views", f"dir:{self.views}", "--ledger", self.ledger(node), "--final-out", self.final(node),
                "--idle-limit", "120", *(a.replace("{node}", node) for a in self.extra_args)]
        for k, v in self.job_opts.items():
            args += ["--job-opt", f"{k}={v}"]
        log = open(os.path.join(self.root, f"worker-{node}.log"), "a")
        env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
        t = time.time()
        self.procs[node] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        with self._lock:
            self.live.add(node)
        return t

    def run_authority(self) -> None:
        self._thread.start()

    def mark_dead(self, node: str) -> None:
        with self._lock:
            self.live.discard(node)

    def mark_live(self, node: str) -> None:
        with self._lock:
            self.live.add(node)

    def kill(self, node: str, sig: int = signal.SIGKILL) -> float:
        """Mark ``node`` dead for the authority, then signal its process; returns the signal time."""
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            self.mark_dead(node)
        t = time.time()
        os.kill(self.procs[node].pid, sig)
        if sig == signal.SIGKILL:
            self.procs[node].wait(timeout=30)
        return t

    def reports(self, node: str) -> list[dict]:
        return read_reports(self.views, node)

    def _ready(self, node: str) -> bool:
        if self.view is not None and node in self.view.members:
            return True
        reps = self.reports(node)
        return bool(reps) and reps[-1]["kind"] == "waiting"

    def _authority(self) -> None:
        handled_failures: dict[str, int] = {}
        while not self._stop.is_set():
            with self._lock:
                live = set(self.live)
            desired = tuple(n for n in self.nodes if n in live and self._ready(n))
            if self.view is None and len(desired) < len(live):
                self._stop.wait(0.01)
                continue
            failed = False
            if self.view is not None:
                for n in self.view.members:
                    fails = [r for r in self.reports(n) if r["kind"] == "failure" and r["gen"] == self.view.generation]
                    if len(fails) > handled_failures.get(f"{n}@{self.view.generation}", 0):
                        handled_failures[f"{n}@{self.view.generation}"] = len(fails)
                        failed = True
            current = self.view.members if self.view else None
            if desired and (desired != current or failed):
                gen = self.view.generation + 1 if self.view else 1
                self.view = View(gen, desired, Address("127.0.0.1", self.ports[desired[0]]))
                publish_view(self.views, Assignment(self.view, *self.checkpoint))
                self.views_published.append((time.time(), self.view))
            self._stop.wait(0.01)

    def wait_for(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            for n, p in self.procs.items():
                if p.poll() not in (None, 0, -9) and n in self.live:
                    raise AssertionError(f"worker {n} exited with {p.returncode}: {self.log_tail(n)}")
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}; logs: " + " | ".join(self.log_tail(n) for n in self.nodes))

    def progress_step(self, node: str) -> int:
        steps = [r["step"] for r in self.reports(node) if r["kind"] == "progress"]
        return max(steps) if steps else 0

    def log_tail(self, node: str) -> str:
        path = os.path.join(self.root, f"worker-{node}.log")
        if not os.path.exists(path):
            return f"{node}: no log"
        with open(path) as f:
            return f"{node}: " + f.read()[-1500:]

    def wait_exit(self, nodes: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for n in nodes:
            rc = self.procs[n].wait(timeout=max(1.0, deadline - time.monotonic()))
            assert rc == 0, f"worker {n} exited {rc}: {self.log_tail(n)}"

    def close(self) -> None:
        self._stop.set()
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=30)
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def progress_times(reports: list[dict]) -> list[tuple[float, int]]:
    return [(r["t"], r["step"]) for r in reports if r["kind"] == "progress"]
