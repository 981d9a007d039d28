"""Counts the bytes this box's daemon and worker move across sites: every reading (the metrics'
beat) takes the kernel's counters of their TCP connections (serve/tcp_diag.py) and adds what the
connections to boxes of another site moved (decide/cross_site.py). Readings are taken and peers'
host names resolved (once each) in threads, so neither /proc, netlink nor a slow resolver holds
the daemon's loop."""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from concurrent.futures import Future
from typing import Callable, Collection, Mapping

from dpeer import procfs
from dpeer.address import Address
from dpeer.daemon.decide.cross_site import CrossSiteBytes, Reading, far_addresses
from dpeer.daemon.node.driver import Node
from dpeer.daemon.serve.status import site_of
from dpeer.daemon.worker.link import WorkerLink

log = logging.getLogger("dpeer.metrics")

Connections = Callable[[Collection[int]], Mapping[int, Reading]]
"""The TCP connections of the namespace among the given socket inodes, by inode (tcp_diag.connections)."""


class SiteBytes:
    """This box's bytes across sites (see the module docstring); `counts` holds the totals."""

    def __init__(self, node: Node, link: WorkerLink | None, connections: Connections) -> None:
        self.node, self.link, self.connections = node, link, connections
        self.counts = CrossSiteBytes()
        self._ips: dict[str, tuple[str, ...]] = {}
        self._resolving: dict[str, Future] = {}
        self._reading: Future | None = None
        self._failed = self._closed = False

    def read(self) -> None:
        """Add the last reading, once taken, and start the next. A reading (the process's fds,
        the kernel's socket dump) is taken in a thread, so the daemon's loop never waits on
        /proc or netlink; what it counted is added on the beat after. While no peer is far
        nothing is read, so a connection to a peer that turns far (its site committed late)
        counts from its start: those bytes crossed too.
        Never raises: the metrics' beat runs in the daemon's chores, which an exception would end
        (and the daemon with them); a reading that fails is logged once and skipped."""
        for part in (self._add_taken, self._take_next):  # a failed reading does not stop the next
            try:
                part()
            except Exception as exc:  # noqa: BLE001 (a counter must not take the daemon down)
                if not self._failed:
                    log.warning("cannot count the bytes crossing sites (%s: %s); trying again on every beat",
                                type(exc).__name__, exc, exc_info=True)
                self._failed = True

    def _add_taken(self) -> None:
        """The reading in the thread, added once it is done (its error raised here)."""
        reading = self._reading
        if reading is None or not reading.done():
            return
        self._reading = None
        connections, owners, far = reading.result()
        self.counts.add(connections, owners, far)
        self._failed = False

    def _take_next(self) -> None:
        """Start a reading of the far peers' connections, unless one is under way or none is far."""
        if self._reading is not None or self._closed:
            return
        state = self.node.reads.state
        sites = {nid: site_of(state, nid) for nid in state.members}
        hosts = {nid: self._resolved(Address.read(m.addr).host) for nid, m in state.members.items()}
        far = far_addresses(sites, hosts, self.node.id)
        if not far:
            return
        worker = getattr(self.link.worker, "proc", None) if self.link is not None else None
        # a worker not reaped yet (poll() is the supervisor's)
        pid = worker.pid if worker is not None and worker.returncode is None else None
        self._reading = _in_thread(lambda: self._take(pid, far), "dpeer-site-bytes")

    def _take(self, worker: int | None, far: Collection[str]) -> tuple[Mapping[int, Reading], dict[int, str],
                                                                       Collection[str]]:
        """In the thread: the daemon's and the worker's sockets, and the kernel's counters of them."""
        owners = dict.fromkeys(procfs.sockets(), "daemon")
        if worker is not None:
            owners.update(dict.fromkeys(procfs.sockets(worker), "worker"))
        return self.connections(owners.keys()), owners, far

    def close(self) -> None:
        """Start no more lookups (one under way ends on its own: its thread is a daemon thread,
        so a resolver that hangs never holds the process's exit, as a pool's worker would)."""
        self._closed = True

    def _resolved(self, host: str) -> tuple[str, ...]:
        """The IPs of host: at once for an IP address, else once its lookup in the thread is done
        (a failed lookup is tried again on a later reading)."""
        if host in self._ips:
            return self._ips[host]
        if not host:  # an address no box listens at (Address.read): nothing to look up
            return ()
        try:
            self._ips[host] = (_canonical(host),)
            return self._ips[host]
        except ValueError:
            pass
        pending = self._resolving.get(host)
        if pending is None:
            if not self._closed:
                self._resolving[host] = _in_thread(lambda: _lookup(host), "dpeer-resolve")
        elif pending.done():
            del self._resolving[host]
            if pending.exception() is None:
                self._ips[host] = pending.result()
                return self._ips[host]
        return ()


def _canonical(ip: str) -> str:
    """An IP address as tcp_diag writes it (an IPv4-mapped IPv6 address as IPv4); ValueError if none."""
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def _in_thread(work: Callable[[], object], name: str) -> Future:
    """work's result in a daemon thread of its own, which never holds the process's exit (one at
    a time per host's lookup, see _resolved; per reading, see _take_next)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # noqa: BLE001 (handed to the reader of the future)
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _lookup(host: str) -> tuple[str, ...]:
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return tuple(sorted({_canonical(str(info[4][0])) for info in infos}))
