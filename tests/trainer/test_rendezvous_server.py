"""The rendezvous store as a stranger meets it (issue 35): nothing is read or written without the
generation's key, a replayed or forged frame closes its connection, a flood of connections or
bytes costs a bounded amount, and a member is still served throughout."""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import time
from typing import Iterator

import pytest
import torch.distributed as dist

from dpeer.trainer import rendezvous_server, rendezvous_wire as wire
from dpeer.trainer.group import bind_store_socket
from dpeer.trainer.rendezvous import GenerationStore, RendezvousClient, RendezvousError
from dpeer.trainer.rendezvous_server import RendezvousServer
from dpeer.trainer.rendezvous_table import Limits, RendezvousTable, Status

KEY = b"k" * 32


@pytest.fixture()
def server() -> Iterator[RendezvousServer]:
    srv = RendezvousServer(bind_store_socket("127.0.0.1", 0))
    srv.allow(7, KEY)
    yield srv
    srv.close()


def member(server: RendezvousServer, key: bytes = KEY, generation: int = 7, timeout: float = 2.0) -> GenerationStore:
    return GenerationStore(RendezvousClient("127.0.0.1", server.port), generation, key, timeout=timeout)


def raw(server: RendezvousServer) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    return sock, wire.read_greeting(_recv(sock, wire.GREETING_BYTES))


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def closed(sock: socket.socket) -> bool:
    """Whether the server closed sock (it reads end of file within 5 s)."""
    sock.settimeout(5)
    try:
        while chunk := sock.recv(4096):
            del chunk
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_a_member_with_the_key_sets_gets_and_seals(server: RendezvousServer) -> None:
    store = member(server)
    store.set("a", b"1")
    assert store.get("a") == b"1" and store.add("n", 2) == 2 and store.add("n", 0) == 2
    assert store.compare_set("sealed", "", "go") == b"go" and store.compare_set("sealed", "", "abandoned") == b"go"
    assert store.check(["a", "n"]) and not store.check(["a", "zzz"]) and store.num_keys() == 3
    assert store.delete_key("a") and not store.delete_key("a")


def test_a_stranger_without_the_key_reads_and_writes_nothing_and_is_closed(server: RendezvousServer) -> None:
    stranger = member(server, key=b"x" * 32, timeout=0.2)
    with pytest.raises(dist.DistStoreError, match="closed the connection"):
        stranger.compare_set("sealed", "", "abandoned")  # the write that stalled training for good
    assert server.refused >= 1
    assert member(server).compare_set("sealed", "", "go") == b"go"  # the members' outcome stands


def test_a_stranger_guessing_a_generation_learns_nothing_and_gets_one_answer(server: RendezvousServer) -> None:
    sock, nonce = raw(server)
    sock.sendall(b"".join(wire.frame(None, b"q", nonce, [10**9 + i, i + 1, "get", ["0/0"]]) for i in range(5000)))
    mac, _, message = wire.split(_recv(sock, wire.frame_length(_recv(sock, wire.LEN_BYTES))))
    assert message == [1, Status.UNKNOWN.value, None] and mac == wire.NO_TAG
    assert closed(sock), "a connection that proved no key is closed after one answer (a review found millions)"


def test_a_member_polling_before_its_host_takes_up_the_generation_gets_through() -> None:
    srv = RendezvousServer(bind_store_socket("127.0.0.1", 0))
    store = member(srv, generation=9, timeout=10.0)
    later = threading.Timer(0.3, lambda: srv.allow(9, KEY))
    later.start()
    try:
        assert store.add("arrived", 1) == 1  # "unknown" (a closed connection) until allowed, then served
    finally:
        later.join()
        srv.close()


def test_a_group_larger_than_the_strangers_cap_meets_at_its_store(server: RendezvousServer) -> None:
    """Members' connections (proven) are not counted against the cap on strangers (a review: 70 members
    could not form when every connection counted)."""
    world = rendezvous_server.MAX_UNPROVEN + 6
    stores = [member(server, timeout=20.0) for _ in range(world)]
    failures: list[str] = []

    def arrive(store: GenerationStore) -> None:
        try:
            if store.add("arrived", 1) == world:
                store.set("all-arrived", b"1")
            store.wait(["all-arrived"])
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            failures.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=arrive, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures[:3]
    for s in stores:
        s.client.close()


def test_a_replayed_frame_does_not_verify_on_its_own_connection_or_another(server: RendezvousServer) -> None:
    sock, nonce = raw(server)
    request = wire.frame(KEY, b"q", nonce, [7, 1, "add", ["arrived", 1]])
    sock.sendall(request)
    _recv(sock, wire.frame_length(_recv(sock, wire.LEN_BYTES)))
    sock.sendall(request)  # the same counter again: a replay
    assert closed(sock)
    other, _ = raw(server)
    other.sendall(request)  # another connection has another nonce
    assert closed(other)
    assert member(server).add("arrived", 0) == 1 and server.refused == 2


def test_an_answer_without_the_key_is_refused_by_the_member() -> None:
    """A stranger's server (or one on the path) cannot hand a member another group's addresses."""
    listener = bind_store_socket("127.0.0.1", 0)

    def impostor() -> None:
        conn, _ = listener.accept()
        nonce = os.urandom(wire.NONCE_BYTES)
        conn.sendall(wire.greeting(nonce))
        _recv(conn, wire.frame_length(_recv(conn, wire.LEN_BYTES)))
        conn.sendall(wire.frame(b"y" * 32, b"r", nonce, [1, Status.OK.value, b"10.6.6.6:666"]))
        conn.close()

    threading.Thread(target=impostor, daemon=True).start()
    store = GenerationStore(RendezvousClient("127.0.0.1", listener.getsockname()[1]), 7, KEY, timeout=2.0)
    with pytest.raises(RendezvousError, match="without the generation's key"):
        store.get("0/1")
    listener.close()


def test_torchs_own_store_client_gets_nowhere(server: RendezvousServer) -> None:
    t0 = time.monotonic()
    with pytest.raises((RuntimeError, ValueError)):
        dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=dt.timedelta(seconds=3))
    assert time.monotonic() - t0 < 30
    assert member(server).add("arrived", 1) == 1


def test_a_frame_announcing_more_than_the_bound_closes_its_connection(server: RendezvousServer) -> None:
    sock, _ = raw(server)
    sock.sendall((100 << 20).to_bytes(4, "big") + os.urandom(1024))
    assert closed(sock)
    garbage, _ = raw(server)
    garbage.sendall(b"\x00\x00\x01\x00" + os.urandom(256))  # the right size, no tag, no msgpack
    assert closed(garbage) and until(lambda: server.refused == 2)


def test_a_flood_of_idle_connections_is_bounded_and_a_member_still_gets_in(server: RendezvousServer) -> None:
    flood = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(300)]
    try:
        store = member(server)
        assert store.add("arrived", 1) == 1
        assert until(lambda: len(server._conns) <= rendezvous_server.MAX_UNPROVEN + 1)
        assert threading.active_count() < 20
    finally:
        for s in flood:
            s.close()


def test_a_member_cannot_grow_the_store_without_bound(server: RendezvousServer) -> None:
    store = member(server)
    with pytest.raises(RendezvousError, match="at most"):
        store.set("big", b"x" * (Limits().max_value + 1))
    table = RendezvousTable(Limits(max_keys=3, max_bytes=100, max_value=40))
    table.allow(1)
    assert [table.apply(1, "set", [f"k{i}", b"v"])[0] for i in range(4)][-1] is Status.REFUSED
    assert table.apply(1, "set", ["k0", b"x" * 41])[0] is Status.REFUSED
    assert table.apply(1, "set", ["k0", b"x" * 40])[0] is Status.OK
    assert table.apply(1, "set", ["k1", b"x" * 40])[0] is Status.OK
    assert table.apply(1, "set", ["k2", b"x" * 40])[0] is Status.REFUSED  # 100 bytes in all


def test_old_generations_are_dropped_as_new_ones_come() -> None:
    table = RendezvousTable()
    assert table.allow(1) == [] and table.allow(2) == [] and table.allow(3) == [1]
    assert table.apply(1, "get", ["k"])[0] is Status.UNKNOWN and table.allowed(3)


@pytest.mark.parametrize("op,args", [("nope", []), ("set", [1, b"v"]), ("set", ["k", "text"]), ("add", ["k", 2**70]),
                                     ("check", ["k"]), ("compare_set", ["k", b"", 3]), ("get", [])])
def test_malformed_requests_are_refused_with_a_reason(op: str, args: list) -> None:
    table = RendezvousTable()
    table.allow(1)
    status, reason = table.apply(1, op, args)
    assert status is Status.REFUSED and isinstance(reason, str) and reason
