"""The group's connections are found by when they appeared and shut; a descriptor reused since by
another socket is left alone; listeners and store connections are never among them."""

from __future__ import annotations

import os
import socket

import pytest

from dpeer import procfs
from dpeer.trainer import gloo_cut
from dpeer.trainer.gloo_cut import GroupSockets, foreign_connections


def connected_pair(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    return client, accepted


def test_new_established_connections_are_found_and_cut_but_not_listeners_or_store_ones() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_server(("127.0.0.1", 0)) as store:
        before = set(procfs.sockets())
        client, accepted = connected_pair(server)
        store_client, store_accepted = connected_pair(store)
        listener = socket.create_server(("127.0.0.1", 0))
        found = GroupSockets.established(before, {store.getsockname()[1]})
        assert set(found.sockets.values()) == {client.fileno(), accepted.fileno()}
        assert found.cut() == 2
        assert client.recv(1) == b""  # shut: the peer sees the end at once
        store_client.sendall(b"x")
        assert store_accepted.recv(1) == b"x"  # the store's connection still works
        for s in (client, accepted, store_client, store_accepted, listener):
            s.close()


def test_a_descriptor_reused_by_another_socket_is_left_alone() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        before = set(procfs.sockets())
        old, old_peer = connected_pair(server)
        found = GroupSockets.established(before, set())
        fd = old.fileno()
        old.close()
        old_peer.close()
        new, new_peer = connected_pair(server)
        if new.fileno() != fd and new_peer.fileno() != fd:  # make the number reused for sure
            os.dup2(new.fileno(), fd)
            new.close()
            new = socket.socket(fileno=fd)
        assert found.cut() == 0
        new.sendall(b"y")
        assert new_peer.recv(1) == b"y"
        new.close()
        new_peer.close()


def test_strangers_connections_are_counted_and_the_tcp_tables_read_only_for_new_sockets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections to a listening port that are not the group's count as a stranger's; the store's
    port does not; a second look with no new socket reads no TCP table (long on a busy host), and a
    new stranger is counted at the next."""
    with socket.create_server(("127.0.0.1", 0)) as gloo, socket.create_server(("127.0.0.1", 0)) as store:
        before = set(procfs.sockets())
        mine, mine_accepted = connected_pair(gloo)
        own = set(GroupSockets.established(before, {store.getsockname()[1]}).sockets)
        stranger, stranger_accepted = connected_pair(gloo)
        store_client, store_accepted = connected_pair(store)
        judged: dict[int, bool] = {}
        skip = {store.getsockname()[1]}
        assert foreign_connections(own, skip, judged) == 1
        reads = []
        real = gloo_cut.tcp_sockets
        monkeypatch.setattr(gloo_cut, "tcp_sockets", lambda: reads.append(1) or real())
        assert foreign_connections(own, skip, judged) == 1 and reads == []
        second, second_accepted = connected_pair(gloo)
        assert foreign_connections(own, skip, judged) == 2 and len(reads) == 1
        stranger_accepted.close()
        assert foreign_connections(own, skip, judged) == 1
        for s in (mine, mine_accepted, stranger, store_client, store_accepted, second, second_accepted):
            s.close()
