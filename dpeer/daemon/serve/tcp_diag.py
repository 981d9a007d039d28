"""The bytes each TCP connection of this network namespace has moved, from the kernel (Linux's
sock_diag netlink interface, as `ss -ti` reads them).

Read-only and unprivileged: the kernel answers for every socket of the namespace; a process's
own are told apart by their inodes (dpeer.procfs). Elsewhere than Linux it reads nothing.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Collection

from dpeer.daemon.decide.cross_site import Reading

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_INET_DIAG_INFO = 2
_LISTEN = 10  # TCP_LISTEN: a listener moves no bytes of its own
_HEADER = struct.Struct("=LHHLL")  # nlmsghdr
_REQUEST = struct.Struct("=BBBBL48s")  # inet_diag_req_v2: family, protocol, ext, pad, states, sockid
_MESSAGE = struct.Struct("=BBBB2s2s16s16sLQLLLLL")  # inet_diag_msg: ..., sockid, expires, rqueue, wqueue, uid, inode
_INODE, _INODE_AT = struct.Struct("=L"), _MESSAGE.size - 4  # idiag_inode, the message's last field
_REMOTE_AT = 24  # idiag_dst in the message (after family, state, timer, retrans, sport, dport, src)
_ATTR = struct.Struct("=HH")  # rtattr
_BYTES_ACKED = struct.Struct("=QQ")  # tcp_info's tcpi_bytes_acked, tcpi_bytes_received
_BYTES_AT = 120  # their offset in struct tcp_info (Linux 4.2 and later)
MAX_REPLIES = 100_000  # netlink datagrams read for one dump at most (a bound, not a figure seen)


def connections(inodes: Collection[int] | None = None) -> dict[int, Reading]:
    """Every TCP connection (not listener) of this network namespace, by socket inode (only those
    of `inodes` when given: the others are skipped unread, a busy host's table costs little);
    {} where the kernel offers no sock_diag (not Linux) or refuses it."""
    found: dict[int, Reading] = {}
    wanted = None if inodes is None else frozenset(inodes)
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            found.update(_dump(family, wanted))
        except OSError:
            continue
    return found


def _dump(family: int, wanted: frozenset[int] | None = None) -> dict[int, Reading]:
    states = 0xFFFFFFFF & ~(1 << _LISTEN)
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), 0, states, b"")
    header = _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
    found: dict[int, Reading] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(2.0)
        nl.send(header + request)
        for _ in range(MAX_REPLIES):
            data = nl.recv(1 << 16)
            if not _parse(data, family, found, wanted):
                return found
    return found


def _parse(data: bytes, family: int, found: dict[int, Reading], wanted: frozenset[int] | None = None) -> bool:
    """Add the connections of one netlink datagram (those of `wanted` when given); False once the
    dump is done, failed, or the datagram is malformed (a message longer than what arrived)."""
    at = 0
    while at + _HEADER.size <= len(data):
        length, kind = _HEADER.unpack_from(data, at)[:2]
        if length < _HEADER.size or at + length > len(data) or kind in (_NLMSG_DONE, _NLMSG_ERROR):
            return False
        if length - _HEADER.size >= _MESSAGE.size:
            inode = _INODE.unpack_from(data, at + _HEADER.size + _INODE_AT)[0]
            if wanted is None or inode in wanted:
                body = memoryview(data)[at + _HEADER.size:at + length]
                sent_received = _tcp_bytes(body[_MESSAGE.size:])
                if sent_received is not None:
                    found[inode] = Reading(_address(family, bytes(body[_REMOTE_AT:_REMOTE_AT + 16])), *sent_received)
        at += (length + 3) & ~3
    return True


def _tcp_bytes(attrs: bytes | memoryview) -> tuple[int, int] | None:
    """tcp_info's bytes acked and received from a message's attributes (None: not reported, or
    an attribute longer than the message holds)."""
    at = 0
    while at + _ATTR.size <= len(attrs):
        length, kind = _ATTR.unpack_from(attrs, at)
        if length < _ATTR.size or at + length > len(attrs):
            return None
        if kind == _INET_DIAG_INFO and length - _ATTR.size >= _BYTES_AT + _BYTES_ACKED.size:
            return _BYTES_ACKED.unpack_from(attrs, at + _ATTR.size + _BYTES_AT)
        at += (length + 3) & ~3
    return None


def _address(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return str(ipaddress.IPv4Address(raw[:4]))
    address = ipaddress.IPv6Address(raw)
    return str(address.ipv4_mapped or address)
