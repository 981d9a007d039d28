"""Boxes in network namespaces of their own, on one bridge, whose links a chaos run or a test cuts.

Each node gets a namespace with one veth interface on a private /24, its peer end plugged into a
bridge in the root namespace (which holds .254, so the test reaches every node while its link is
up). Cutting a node sets its veth's root end down: everything it sends or receives is cut, its
daemon's gRPC, the rendezvous store, Gloo and the heal alike, unlike the transport's fault hook.
Names carry the creating process's pid, so parallel runs do not collide; close() removes everything.
Needs root (``why_not`` says so); used by ``dpeer chaos --netns`` and tests/integration/test_netns_partition.py
(whose daemons tests/support/netns_boxes.py starts).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def why_not() -> str | None:
    """Why namespaces cannot be made here, or None when they can (tried, then removed)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"dpq{os.getpid() % 100000}"
    try:
        _ip("netns", "add", name)
        _ip("netns", "del", name)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot make a network namespace here ({exc})"
    return None


def subnet_of(tag: int) -> str:
    """The /24 (its first three octets) of the run tagged `tag` (0..9999): one per tag, so two
    runs at once never put the same subnet on two bridges."""
    return f"10.{77 + tag // 250}.{tag % 250}"


@dataclass
class Net:
    """The bridge and the namespaces."""

    root: Path
    size: int
    tag: str = field(default_factory=lambda: f"{os.getpid() % 10000}")

    def __post_init__(self) -> None:
        self.subnet = subnet_of(int(self.tag))
        self.bridge = f"dp{self.tag}br"
        try:
            self._build()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            self.close()
            said = exc.stderr if isinstance(exc.stderr, str) else ""
            raise ValueError(f"cannot set up the network namespaces: `{' '.join(exc.cmd)}` said "
                             f"{said.strip() or exc}") from None

    def _build(self) -> None:
        self._made: list[list[str]] = []  # the delete commands of what this Net made, newest last
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(["link", "del", self.bridge])
        _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(1, self.size + 1):
            ns, host_end = self.ns(i), self.veth(i)
            _ip("netns", "add", ns)
            self._made.append(["netns", "del", ns])
            _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._made.append(["link", "del", host_end])
            _ip("link", "set", host_end, "master", self.bridge)
            _ip("link", "set", host_end, "up")
            _ip("-n", ns, "addr", "add", f"{self.addr_of(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def ns(self, i: int) -> str:
        return f"dp{self.tag}n{i}"

    def veth(self, i: int) -> str:
        return f"dp{self.tag}h{i}"

    def addr_of(self, i: int) -> str:
        return f"{self.subnet}.{i}"

    def prefix(self, i: int) -> list[str]:
        """The command prefix that runs a program inside node i's namespace."""
        return ["ip", "netns", "exec", self.ns(i)]

    def cut(self, i: int) -> None:
        """Cut node i off the network (its link goes down)."""
        _ip("link", "set", self.veth(i), "down")

    def heal(self, i: int) -> None:
        """Plug node i back in."""
        _ip("link", "set", self.veth(i), "up")

    def close(self) -> None:
        """Remove the namespaces, links and bridge this Net made (end the processes in them first)."""
        for command in reversed(self._made):  # only what this Net made: a name taken by another run stays theirs
            subprocess.run(["ip", *command], capture_output=True, timeout=30)
        self._made = []
