"""The kernel's per-connection byte counters (dpeer/daemon/serve/tcp_diag.py), read on real
loopback connections of this process."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from dpeer.daemon.serve.tcp_diag import connections, process_sockets

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
            mine = process_sockets(os.getpid())
            ours = {os.fstat(s.fileno()).st_ino: s for s in (client, accepted)}
            assert ours.keys() <= mine
            seen = connections()
            out, back = seen[os.fstat(client.fileno()).st_ino], seen[os.fstat(accepted.fileno()).st_ino]
    assert out.remote == back.remote == "127.0.0.1"
    assert 300_000 <= out.sent <= 300_001 and back.received == 300_000  # the kernel acks the SYN too
    assert back.sent >= 1000 and out.received >= 1000


def test_a_process_that_is_gone_holds_no_sockets() -> None:
    assert process_sockets(2**22 + 12345) == set()
