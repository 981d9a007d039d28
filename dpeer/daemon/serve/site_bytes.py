"""Counts the bytes this box's daemon and worker move across sites: every reading (the metrics'
beat) takes the kernel's counters of their TCP connections (serve/tcp_diag.py) and adds what the
connections to boxes of another site moved (decide/cross_site.py). Peers' host names are
resolved in a thread, once each, so a slow resolver never holds the daemon's loop."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
from concurrent.futures import Future
from typing import Callable, Collection, Mapping

from dpeer.address import Address
from dpeer.daemon.decide.cross_site import CrossSiteBytes, Reading, far_addresses
from dpeer.daemon.node.driver import Node
from dpeer.daemon.serve.status import site_of
from dpeer.daemon.serve.tcp_diag import process_sockets
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
        self._failed = self._closed = False

    def read(self) -> None:
        """Add what moved across sites since the last reading. While no peer is far nothing is
        read, so a connection to a peer that turns far (its site committed late) counts from its
        start: those bytes crossed too.
        Never raises: the metrics' beat runs in the daemon's chores, which an exception would end
        (and the daemon with them); a reading that fails is logged once and skipped."""
        try:
            self._read()
        except Exception as exc:  # noqa: BLE001 (a counter must not take the daemon down)
            if not self._failed:
                log.warning("cannot count the bytes crossing sites (%s: %s); trying again on every beat",
                            type(exc).__name__, exc, exc_info=True)
            self._failed = True
        else:
            self._failed = False

    def _read(self) -> None:
        state = self.node.reads.state
        sites = {nid: site_of(state, nid) for nid in state.members}
        hosts = {nid: self._resolved(Address.read(m.addr).host) for nid, m in state.members.items()}
        far = far_addresses(sites, hosts, self.node.id)
        if not far:
            return
        owners = dict.fromkeys(process_sockets(os.getpid()), "daemon")
        worker = getattr(self.link.worker, "proc", None) if self.link is not None else None
        if worker is not None and worker.returncode is None:  # not reaped (poll() is the supervisor's)
            owners.update(dict.fromkeys(process_sockets(worker.pid), "worker"))
        self.counts.add(self.connections(owners.keys()), owners, far)

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
                self._resolving[host] = _in_thread(host)
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


def _in_thread(host: str) -> Future:
    """host's lookup in a daemon thread of its own (one at most per host: see _resolved)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(_lookup(host))
        except BaseException as exc:  # noqa: BLE001 (handed to the reader of the future)
            future.set_exception(exc)

    threading.Thread(target=run, name="dpeer-resolve", daemon=True).start()
    return future


def _lookup(host: str) -> tuple[str, ...]:
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return tuple(sorted({_canonical(str(info[4][0])) for info in infos}))
