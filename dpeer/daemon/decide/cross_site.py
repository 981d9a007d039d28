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


KEEP_READINGS = 8
"""Readings a connection's last counters are kept after it was last read: a connection that one
reading misses (a sock_diag dump that skipped it while the socket table changed, a family's dump
that failed, a /proc listing that raced) is then counted on from them when it is read again,
not a second time from zero."""


@dataclass
class CrossSiteBytes:
    """The bytes this box's processes moved across sites since the daemon started, by process
    ("daemon", "worker") and direction; each reading adds what every connection to a far address
    moved since the previous one. What a connection moved after the last reading before it closed
    is not counted (at most one reading interval of its traffic)."""

    totals: dict[tuple[str, str], int] = field(default_factory=dict)
    _last: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # inode -> sent, received, reading
    _readings: int = 0

    def add(self, readings: Mapping[int, Reading], owners: Mapping[int, str], far: Collection[str]) -> None:
        """Take one reading: readings maps socket inode -> Reading (every connection of the
        namespace), owners maps the inodes this box's processes hold -> the process. A connection
        first read counts from zero; one whose counters went back is a new connection under a
        reused inode and counts from zero too."""
        self._readings += 1
        for inode, process in owners.items():
            reading = readings.get(inode)
            if reading is None:
                continue
            now = (reading.sent, reading.received)
            before = self._last.get(inode)
            then = before[:2] if before is not None and before[0] <= now[0] and before[1] <= now[1] else (0, 0)
            self._last[inode] = (*now, self._readings)
            if reading.remote in far:
                for direction, moved in zip(DIRECTIONS, (now[0] - then[0], now[1] - then[1])):
                    key = (process, direction)
                    self.totals[key] = self.totals.get(key, 0) + moved
        for inode in [i for i, (_, _, seen) in self._last.items() if seen <= self._readings - KEEP_READINGS]:
            del self._last[inode]

    def document(self) -> dict[str, dict[str, int]]:
        """{"daemon": {"sent": n, "received": n}, "worker": {...}} for the status."""
        return {p: {d: self.totals.get((p, d), 0) for d in DIRECTIONS} for p in ("daemon", "worker")}
