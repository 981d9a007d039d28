"""Bytes crossing sites, as pure bookkeeping: which peer addresses stand in another site, and how
many bytes this box's processes moved to and from them between two readings of the kernel's
per-connection counters (daemon/serve/site_bytes.py reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping

DIRECTIONS = ("sent", "received")


@dataclass(frozen=True)
class Reading:
    """One connection as the kernel counts it: the peer's IP and the bytes over its life."""

    remote: str
    sent: int
    received: int


def far_addresses(sites: Mapping[str, str | None], hosts: Mapping[str, Collection[str]], me: str) -> frozenset[str]:
    """The IP addresses of the boxes in another site than `me`'s: sites maps node id -> committed
    site (None: not known yet), hosts maps node id -> the IPs its address resolves to. An IP that
    boxes of this site hold too (several boxes on one host, loopback) is never far: its bytes
    cannot be told apart. Empty while this box's own site is not known."""
    mine = sites.get(me)
    if mine is None:
        return frozenset()
    far, near = set(), set()
    for node, site in sites.items():
        ips = hosts.get(node, ())
        if site == mine or node == me:
            near.update(ips)
        elif site is not None:
            far.update(ips)
    return frozenset(far - near)


@dataclass
class CrossSiteBytes:
    """The bytes this box's processes moved across sites since the daemon started, by process
    ("daemon", "worker") and direction; each reading adds what every connection to a far address
    moved since the previous one. What a connection moved after the last reading before it closed
    is not counted (at most one reading interval of its traffic)."""

    totals: dict[tuple[str, str], int] = field(default_factory=dict)
    _last: dict[int, tuple[int, int]] = field(default_factory=dict)

    def add(self, readings: Mapping[int, Reading], owners: Mapping[int, str], far: Collection[str]) -> None:
        """Take one reading: readings maps socket inode -> Reading (every connection of the
        namespace), owners maps the inodes this box's processes hold -> the process."""
        seen = {}
        for inode, process in owners.items():
            reading = readings.get(inode)
            if reading is None:
                continue
            seen[inode] = (reading.sent, reading.received)
            if reading.remote in far:
                before = self._last.get(inode, (0, 0))
                for direction, now, then in zip(DIRECTIONS, seen[inode], before):
                    key = (process, direction)
                    self.totals[key] = self.totals.get(key, 0) + max(0, now - then)
        self._last = seen

    def document(self) -> dict[str, dict[str, int]]:
        """{"daemon": {"sent": n, "received": n}, "worker": {...}} for the status."""
        return {p: {d: self.totals.get((p, d), 0) for d in DIRECTIONS} for p in ("daemon", "worker")}
