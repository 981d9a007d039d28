"""The group's connections are found by when they appeared and shut; a descriptor reused since by
another socket is left alone; listeners and store connections are never among them."""

from __future__ import annotations

import os
import socket

from dpeer.trainer.gloo_cut import GroupSockets, socket_inodes


def connected_pair(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    return client, accepted


def test_new_established_connections_are_found_and_cut_but_not_listeners_or_store_ones() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_server(("127.0.0.1", 0)) as store:
        before = set(socket_inodes())
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
        before = set(socket_inodes())
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
