"""The rendezvous before init is sealed once: no member gives up after another went on to init;
a member that reaches the store before its host listens waits for it."""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator

import pytest

from dpeer.address import Address
from dpeer.trainer.group import GroupError, GroupManager, Superseded, bind_store_socket, derive
from dpeer.trainer.rendezvous import GenerationStore, RendezvousClient
from dpeer.trainer.rendezvous_server import RendezvousServer
from dpeer.view import View

VIEW = View(7, ("a", "b"), Address("127.0.0.1", 1), "s" * 32)
KEY = derive(VIEW.secret, "rendezvous", 7)


@pytest.fixture()
def store() -> Iterator[GenerationStore]:
    server = RendezvousServer(bind_store_socket("127.0.0.1", 0))
    server.allow(7, KEY)
    client = RendezvousClient("127.0.0.1", server.port)
    yield GenerationStore(client, 7, KEY, timeout=5.0)
    client.close()
    server.close()


def test_a_member_that_gave_up_makes_a_late_member_give_up_too(store: GenerationStore) -> None:
    gm = GroupManager("a")
    with pytest.raises(Superseded):
        gm._rendezvous(store, VIEW, lambda: True, time.monotonic() + 5)  # a saw a newer view
    with pytest.raises(Superseded, match="abandoned"):
        gm._rendezvous(store, VIEW, lambda: False, time.monotonic() + 5)  # b arrives: world counted, but sealed


def test_a_member_that_counts_every_arrival_seals_go(store: GenerationStore) -> None:
    store.add("arrived", 1)  # b arrived first and waits
    GroupManager("a")._rendezvous(store, VIEW, lambda: False, time.monotonic() + 5)
    assert store.get("sealed") == b"go"


def test_a_member_too_late_to_give_up_goes_on_to_init(store: GenerationStore) -> None:
    """It polled before the last arrival, then saw a newer view; meanwhile the last member
    sealed go and is in init: giving up now would strand it, so it goes on too."""
    store.set("sealed", "go")
    GroupManager("a")._rendezvous(store, VIEW, lambda: True, time.monotonic() + 5)


def test_a_timeout_before_anyone_sealed_is_a_group_error(store: GenerationStore) -> None:
    with pytest.raises(GroupError, match="1/2 members arrived"):
        GroupManager("a")._rendezvous(store, VIEW, lambda: False, time.monotonic() + 0.05)
    assert store.get("sealed") == b"abandoned"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_member_that_reaches_the_store_before_its_host_listens_connects_once_it_does() -> None:
    port, hosted, started = free_port(), [], threading.Event()

    def host_later() -> None:
        started.wait(5)
        hosted.append(RendezvousServer(bind_store_socket("127.0.0.1", port)))
        hosted[0].allow(7, KEY)

    thread = threading.Thread(target=host_later)
    thread.start()
    gm = GroupManager("b")
    polls = iter(range(10**6))
    client = gm._client_store("127.0.0.1", port, time.monotonic() + 20,
                              lambda: next(polls) == 3 and started.set() is None and False)
    thread.join()
    GenerationStore(client, 7, KEY, 5.0).set("k", "v")
    assert GenerationStore(RendezvousClient("127.0.0.1", port), 7, KEY, 5.0).get("k") == b"v"
    gm.close()
    hosted[0].close()


def test_a_newer_view_ends_the_wait_for_a_store_that_never_listens() -> None:
    views = iter([False, False, True])
    with pytest.raises(Superseded, match="while connecting to store"):
        GroupManager("b")._client_store("127.0.0.1", free_port(), time.monotonic() + 20, lambda: next(views))


def test_a_store_that_never_listens_is_a_group_error_at_the_deadline() -> None:
    with pytest.raises(GroupError, match="does not accept connections yet"):
        GroupManager("b")._client_store("127.0.0.1", free_port(), time.monotonic() + 0.1, lambda: False)


def test_a_port_that_answers_as_something_else_is_a_group_error_naming_it() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]

        def answer() -> None:
            conn, _ = other.accept()
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(GroupError, match="not as a dpeer rendezvous store"):
            GroupManager("b")._client_store("127.0.0.1", port, time.monotonic() + 5, lambda: False)


def test_a_busy_store_port_advises_what_the_config_accepts() -> None:
    """store_port must be 1-65535 in the config (unset: any free port); the advice once said "0 picks a free port"."""
    from dpeer.daemon.config import NodeConfig

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as busy:
            bind_store_socket("127.0.0.1", port)
    assert f"127.0.0.1:{port}" in str(busy.value) and "leave store_port unset" in str(busy.value)
    assert "0 picks" not in str(busy.value)
    assert NodeConfig().store_port is None and NodeConfig().store_bind[1] == 0  # unset: any free port
