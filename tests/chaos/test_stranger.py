"""The chaos run's stranger on the data plane (dpeer/chaos/stranger.py): it finds a process's
listening ports as /proc shows them, its TCPStore payload is a SET a real TCPStore takes, and a
visit reaches every port, counting what it did (its requests on dpeer's store wire:
test_store_probe.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import random
import socket

from dpeer.chaos.stranger import Tally, listening_ports, parse_listening, store_set, visit

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1282 1 0 100 0 0 10 0
   1: 0100007F:B1AD 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 39637 1 0 100 0 0 10 0
   2: 0100007F:B1AE 0100007F:0050 01 00000000:00000000 00:00000000 00000000     0        0 39638 1 0 100 0 0 10 0
   3: 0101A8C0:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0 100 0 0 10 0
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 501 1
   1: 0000000000000000FFFF00000100007F:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 502 1
"""


def test_only_the_listening_sockets_of_the_process_count() -> None:
    assert parse_listening(TCP, {"1282", "39637", "39638"}) == [(None, 2024), ("127.0.0.1", 45485)]
    assert parse_listening(TCP, {"777"}) == [("192.168.1.1", 80)]
    assert parse_listening(TCP6, {"501", "502"}) == [(None, 8080), ("127.0.0.1", 8081)]


def test_the_ports_of_a_live_process() -> None:
    with socket.socket() as listener, socket.socket() as idle:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        idle.bind(("127.0.0.1", 0))  # bound, not listening: not a port a stranger can reach
        assert ("127.0.0.1", listener.getsockname()[1]) in listening_ports(os.getpid())
        assert all(port != idle.getsockname()[1] for _, port in listening_ports(os.getpid()))
    assert listening_ports(2**22 + 7) == []  # no such process


def test_the_store_payload_is_a_set_a_tcpstore_takes() -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=dt.timedelta(seconds=10))
    with socket.create_connection(("127.0.0.1", store.port)) as conn:
        conn.sendall(store_set("stranger-1/sealed", b"abandoned"))
        conn.sendall(bytes([3]) + len(b"stranger-1/sealed").to_bytes(8, "little") + b"stranger-1/sealed")  # GET
        conn.settimeout(10)
        reply = b""
        while len(reply) < 8 + len(b"abandoned"):
            reply += conn.recv(64)
    assert reply[8:] == b"abandoned"


def test_a_visit_reaches_every_port_and_counts_what_it_did() -> None:
    received: dict[int, bytes] = {}

    async def go() -> Tally:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            port = writer.get_extra_info("sockname")[1]
            received[port] = received.get(port, b"") + await reader.read()
            writer.close()

        servers = [await asyncio.start_server(serve, "127.0.0.1", 0) for _ in range(2)]
        ports = [s.sockets[0].getsockname()[1] for s in servers]
        tally = Tally()
        await visit(tally, "training", "n1", "127.0.0.1", os.getpid(), ports[0], random.Random(1))
        for _ in range(100):
            if len(received) == 2:
                break
            await asyncio.sleep(0.05)
        for s in servers:
            s.close()
        return tally, ports

    tally, ports = asyncio.run(go())
    assert received[ports[0]].startswith(store_set("x", b"")[:6]) and b"/sealed" in received[ports[0]]
    assert len(received[ports[1]]) >= 16
    assert tally.store_sets == 1 and tally.connections["training"] >= 3 and tally.refused == 0
    assert {f"n1:{p}" for p in ports} <= tally.ports
    assert "1 TCPStore SETs of <prefix>/sealed" in tally.note() and "during training" in tally.note()
