"""The kernel's per-connection byte counters (dpeer/daemon/serve/tcp_diag.py), read on real
loopback connections of this process."""

from __future__ import annotations

import os
import socket
import struct
import sys

import pytest

from dpeer import procfs
from dpeer.daemon.decide.cross_site import Reading
from dpeer.daemon.serve import tcp_diag
from dpeer.daemon.serve.tcp_diag import connections

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag is Linux's")


def test_a_connections_bytes_and_owner_are_read() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with client, accepted:
            client.sendall(b"x" * 300_000)
            got = 0
            while got < 300_000:
                got += len(accepted.recv(1 << 16))
            accepted.sendall(b"y" * 1000)
            assert client.recv(1000)
            mine, by_pid = procfs.sockets(), procfs.sockets(os.getpid())
            ours = {os.fstat(s.fileno()).st_ino: s for s in (client, accepted)}
            assert ours.keys() <= mine.keys() and ours.keys() <= by_pid.keys()
            assert {mine[i] for i in ours} == {s.fileno() for s in ours.values()}
            seen = connections()
            out, back = seen[os.fstat(client.fileno()).st_ino], seen[os.fstat(accepted.fileno()).st_ino]
    assert out.remote == back.remote == "127.0.0.1"
    assert 300_000 <= out.sent <= 300_001 and back.received == 300_000  # the kernel acks the SYN too
    assert back.sent >= 1000 and out.received >= 1000


def test_a_process_that_is_gone_holds_no_sockets() -> None:
    assert procfs.sockets(2**22 + 12345) == {}


def _message(inode: int, info: int = 232, family: int = socket.AF_INET, cut: int | None = None) -> bytes:
    """One SOCK_DIAG_BY_FAMILY reply (a connection to 10.1.0.1 with 1000 bytes acked, 2000
    received), its tcp_info `info` bytes long, the datagram cut to `cut` bytes."""
    ip = bytes([10, 1, 0, 1])
    dst = ip + bytes(12) if family == socket.AF_INET else bytes(10) + b"\xff\xff" + ip
    body = tcp_diag._MESSAGE.pack(family, 1, 0, 0, b"\0\1", b"\0\2", bytes(16), dst, 0, 0, 0, 0, 0, 0, inode)
    tcp_info = bytearray(info)
    if info >= 136:
        struct.pack_into("=QQ", tcp_info, 120, 1000, 2000)
    message = body + tcp_diag._ATTR.pack(4 + info, 2) + bytes(tcp_info)
    data = tcp_diag._HEADER.pack(16 + len(message), 20, 2, 1, 0) + message
    return data if cut is None else data[:cut]


def test_a_reply_is_parsed_and_a_v4_mapped_peer_reads_as_ipv4() -> None:
    found: dict = {}
    assert tcp_diag._parse(_message(7) + _message(8, family=socket.AF_INET6), socket.AF_INET, found)
    assert found[7] == Reading("10.1.0.1", 1000, 2000)
    found = {}
    tcp_diag._parse(_message(8, family=socket.AF_INET6), socket.AF_INET6, found)
    assert found[8] == Reading("10.1.0.1", 1000, 2000)


@pytest.mark.parametrize("cut", [16 + 72 + 4 + 100, 16 + 72 + 2, 16 + 40, 20])
def test_a_truncated_or_malformed_reply_never_raises(cut: int) -> None:
    """A datagram cut short (a reply longer than the read buffer) or an attribute longer than its
    message reads as no connection, never as struct.error out of the metrics' beat."""
    found: dict = {}
    tcp_diag._parse(_message(7, cut=cut), socket.AF_INET, found)
    assert found == {}
    lying = bytearray(_message(7))
    struct.pack_into("=H", lying, 16 + 72, 4000)  # the tcp_info attribute claims more than the message holds
    tcp_diag._parse(bytes(lying) + _message(9), socket.AF_INET, found)
    assert 7 not in found


def test_only_the_wanted_sockets_are_read() -> None:
    """On a host with a huge socket table only the processes' own sockets are decoded."""
    found: dict = {}
    tcp_diag._parse(b"".join(_message(i) for i in range(1, 50)), socket.AF_INET, found, frozenset({3, 40}))
    assert set(found) == {3, 40}


def test_connections_can_be_asked_for_given_sockets() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with client, accepted:
            inode = os.fstat(client.fileno()).st_ino
            assert set(connections({inode})) == {inode}
