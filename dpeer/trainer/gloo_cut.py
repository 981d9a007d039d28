"""Failing a Gloo group's pending operations at once, since Gloo has no abort.

A Gloo group's connections are this process's own TCP sockets. Shutting them down makes every
pending send and receive of the group fail at once with "Connection closed by peer", here and on
the peers, instead of at the collective timeout; the group is then destroyed and re-formed as after
any failure. The group's sockets are told apart by when they appeared: those established while
the group was initialised, less the rendezvous store's (the store outlives groups), are its pairs.
Listening sockets are never touched (Gloo's listener aborts the process when its socket is shut).

Linux only (it reads /proc/self); elsewhere ``established`` finds nothing and a cut does nothing.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from dpeer import procfs

_ESTABLISHED = "01"
_LISTEN = "0A"


def tcp_sockets() -> dict[int, tuple[int, int, str]]:
    """This process's network namespace's TCP sockets: inode -> (local port, remote port, state)."""
    out = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9:
                local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
                out[int(fields[9])] = (int(local, 16), int(remote, 16), fields[3])
    return out


@dataclass(frozen=True)
class GroupSockets:
    """The established TCP connections of one group: inode -> the descriptor they had."""

    sockets: dict[int, int]

    @classmethod
    def established(cls, before: set[int], store_ports: set[int]) -> GroupSockets:
        """The connections established since ``before`` (procfs.sockets' keys taken just before the
        group's init), less any to or from one of ``store_ports``."""
        tcp, held = tcp_sockets(), procfs.sockets()
        mine = {inode: fd for inode, fd in held.items() if inode not in before and inode in tcp
                and tcp[inode][2] == _ESTABLISHED and not {tcp[inode][0], tcp[inode][1]} & store_ports}
        return cls(mine)

    def cut(self) -> int:
        """Shut down every connection still held under its descriptor; returns how many. Each
        descriptor is duplicated first and shut only if the duplicate is still that connection
        (its inode): a number closed and reused since (a new store connection, a new group's
        listener) is left alone."""
        cut = 0
        for inode, fd in self.sockets.items():
            try:
                dup = os.dup(fd)
            except OSError:  # closed since
                continue
            try:
                if os.fstat(dup).st_ino != inode:
                    continue
                with socket.socket(fileno=dup) as sock:  # closing it closes the duplicate only
                    dup = -1
                    sock.shutdown(socket.SHUT_RDWR)
                    cut += 1
            except OSError:
                pass
            finally:
                if dup >= 0:
                    os.close(dup)
        return cut


def foreign_connections(own: set[int], skip_ports: set[int], seen: dict[int, bool]) -> int:
    """Connections this process holds on one of its listening ports (Gloo's; less ``skip_ports``,
    the rendezvous store's) that are not among ``own`` (the group's inodes): what strangers opened.
    Gloo's listener keeps every connection it accepts until the group is destroyed, so they add up.
    ``seen`` keeps each socket's verdict for the caller's group (an inode names one socket for its
    life), so the TCP tables, long on a busy host, are read only when a socket not judged yet is held."""
    held = procfs.sockets()
    if not held.keys() <= seen.keys():
        tcp = tcp_sockets()
        listening = {tcp[inode][0] for inode in held if inode in tcp and tcp[inode][2] == _LISTEN} - skip_ports
        for inode in held.keys() - seen.keys():
            seen[inode] = (inode in tcp and inode not in own and tcp[inode][2] != _LISTEN
                           and tcp[inode][0] in listening)
    return sum(1 for inode in held if seen[inode])
