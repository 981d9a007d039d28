"""Counts the bytes this box's daemon and worker move across sites: every reading (the metrics'
beat) takes the kernel's counters of their TCP connections (serve/tcp_diag.py) and adds what the
connections to boxes of another site moved (decide/cross_site.py). Peers' host names are
resolved in a thread, once each, so a slow resolver never holds the daemon's loop."""

from __future__ import annotations

import ipaddress
import os
import socket
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Mapping

from dpeer.address import Address
from dpeer.daemon.decide.cross_site import CrossSiteBytes, Reading, far_addresses
from dpeer.daemon.node.driver import Node
from dpeer.daemon.serve.status import site_of
from dpeer.daemon.serve.tcp_diag import process_sockets
from dpeer.daemon.worker.link import WorkerLink

Connections = Callable[[], Mapping[int, Reading]]
"""Every TCP connection of the namespace by socket inode (tcp_diag.connections)."""


class SiteBytes:
    """This box's bytes across sites (see the module docstring); `counts` holds the totals."""

    def __init__(self, node: Node, link: WorkerLink | None, connections: Connections) -> None:
        self.node, self.link, self.connections = node, link, connections
        self.counts = CrossSiteBytes()
        self._ips: dict[str, tuple[str, ...]] = {}
        self._resolving: dict[str, Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    def read(self) -> None:
        """Add what moved across sites since the last reading (nothing while no peer is far)."""
        state = self.node.reads.state
        sites = {nid: site_of(state, nid) for nid in state.members}
        hosts = {nid: self._resolved(Address.read(m.addr).host) for nid, m in state.members.items()}
        far = far_addresses(sites, hosts, self.node.id)
        if not far:
            return
        owners = dict.fromkeys(process_sockets(os.getpid()), "daemon")
        worker = self.link.worker.proc if self.link is not None else None
        if worker is not None and worker.returncode is None:  # not reaped (poll() is the supervisor's)
            owners.update(dict.fromkeys(process_sockets(worker.pid), "worker"))
        self.counts.add(self.connections(), owners, far)

    def close(self) -> None:
        """Stop the resolver thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _resolved(self, host: str) -> tuple[str, ...]:
        """The IPs of host: at once for an IP address, else once its lookup in the thread is done
        (a failed lookup is tried again on a later reading)."""
        if host in self._ips:
            return self._ips[host]
        try:
            self._ips[host] = (_canonical(host),)
            return self._ips[host]
        except ValueError:
            pass
        pending = self._resolving.get(host)
        if pending is None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpeer-resolve")
            self._resolving[host] = self._pool.submit(_lookup, host)
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


def _lookup(host: str) -> tuple[str, ...]:
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return tuple(sorted({_canonical(str(info[4][0])) for info in infos}))
