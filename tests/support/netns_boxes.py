"""Daemons started inside a dpeer.chaos.netns.Net's namespaces, for tests/integration/test_netns_partition.py:
`dpeer` commands run in node i's namespace, so they reach node i while its link is cut."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from dpeer.chaos.netns import Net

SOURCE = Path(__file__).resolve().parents[2]  # the folder holding the dpeer package, for the children's path


class Boxes:
    """The daemons a test started in `net`'s namespaces; close() ends them, then the network."""

    def __init__(self, net: Net) -> None:
        self.net = net
        self.procs: dict[int, subprocess.Popen] = {}

    def run(self, i: int, args: list[str], log: Path) -> subprocess.Popen:
        """Start `python -m dpeer.cli.main ARGS` inside node i's namespace, in a session of its own."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPEER_")}
        env.update({"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(SOURCE)})
        with open(log, "ab") as out:
            proc = subprocess.Popen([*self.net.prefix(i), sys.executable, "-m", "dpeer.cli.main", *args],
                                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs[i] = proc
        return proc

    def cli(self, i: int, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """A `dpeer` command run inside node i's namespace (it reaches node i while cut off)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPEER_")}
        env["PYTHONPATH"] = str(SOURCE)
        return subprocess.run([*self.net.prefix(i), sys.executable, "-m", "dpeer.cli.main", *args],
                              capture_output=True, text=True, timeout=timeout, env=env)

    def close(self) -> None:
        """SIGKILL every daemon started here (its process group: daemon and worker), then remove the network."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=30)
        self.net.close()
