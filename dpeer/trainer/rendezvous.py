"""A member's side of the rendezvous store: one authenticated connection per store address, and
the torch.distributed ``Store`` a generation's group forms from.

Every request is tagged with the generation's rendezvous key (derived from the view's secret,
which only the cluster's members learn through the log), and every answer is checked against it,
so neither a stranger's store nor a stranger on the path can hand a member another group's
addresses (rendezvous_wire). ``GenerationStore`` polls where torch's TCPStore would block (a get
of a key not yet set, a wait): the server never holds a request, so it never holds a thread.
"""

from __future__ import annotations

import datetime as dt
import socket
import threading
import time
from typing import Any, Callable

import torch.distributed as dist

from dpeer.trainer import rendezvous_wire as wire
from dpeer.trainer.rendezvous_table import Status

POLL_FIRST_S = 0.0005
POLL_MAX_S = 0.005
CALL_TIMEOUT_S = 5.0


class RendezvousError(RuntimeError):
    """The store refused a request, or answered with bytes that are not its own; the text says which."""


class RendezvousClient:
    """One connection to a rendezvous store, re-opened on demand; safe to share between threads."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._sock: socket.socket | None = None
        self._nonce = b""
        self._counter = 0
        self._lock = threading.Lock()

    def connect(self, timeout: float) -> None:
        """Open the connection unless open (OSError when nothing listens; RendezvousError when
        whatever answers is no dpeer rendezvous store)."""
        with self._lock:
            if self._sock is None:
                self._open(timeout)

    def _open(self, timeout: float) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._nonce = wire.read_greeting(_recv_exact(sock, wire.GREETING_BYTES))
        except (OSError, wire.WireError) as exc:
            sock.close()
            if isinstance(exc, wire.WireError):
                raise RendezvousError(f"{self.host}:{self.port}: {exc}") from None
            raise
        self._sock, self._counter = sock, 0

    def call(self, generation: int, key: bytes, op: str, args: list[Any]) -> tuple[Status, Any]:
        """One request and its answer (OSError: the connection broke, and is closed)."""
        with self._lock:
            if self._sock is None:
                self._open(CALL_TIMEOUT_S)
            assert self._sock is not None
            counter = self._counter + 1
            try:
                self._sock.settimeout(CALL_TIMEOUT_S)
                self._sock.sendall(wire.frame(key, b"q", self._nonce, [generation, counter, op, args]))
                length = wire.frame_length(_recv_exact(self._sock, wire.LEN_BYTES))
                mac, body, message = wire.split(_recv_exact(self._sock, length))
            except (OSError, wire.WireError) as exc:
                self._close()
                if isinstance(exc, wire.WireError):
                    raise RendezvousError(f"store {self.host}:{self.port}: {exc}") from None
                raise
            return self._checked(key, counter, mac, body, message)

    def _checked(self, key: bytes, counter: int, mac: bytes, body: bytes, message: list[Any]) -> tuple[Status, Any]:
        if len(message) != 3 or message[0] != counter or message[1] not in {s.value for s in Status}:
            self._close()
            raise RendezvousError(f"store {self.host}:{self.port} answered out of turn")
        status = Status(message[1])
        if status is Status.UNKNOWN:  # untagged: the server holds no key for it; the request was not run
            if self._counter == 0:
                self._close()  # a connection that proved nothing yet is closed after that one answer
            return status, None
        if not wire.verify(key, b"r", self._nonce, mac, body):
            self._close()
            raise RendezvousError(f"store {self.host}:{self.port} answered without the generation's key: "
                                  "it is not the member that hosts this generation")
        self._counter = counter
        return status, message[2]

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        """Close the connection (the next call opens a new one)."""
        with self._lock:
            self._close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the rendezvous store closed the connection")
        data += chunk
    return bytes(data)


def _bytes(value: str | bytes | bytearray | list[int]) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class GenerationStore(dist.Store):
    """The store one generation forms from: its keys, over an authenticated connection.

    ``waiting`` is polled while a request cannot be served yet (the host has not read the view,
    or is not listening): returning a reason gives up with that reason (a newer view came). The
    deadline bounds every retry; a get or wait of a key not yet set polls until ``timeout``.
    """

    def __init__(self, client: RendezvousClient, generation: int, key: bytes, timeout: float,
                 give_up: Callable[[], BaseException | None] = lambda: None) -> None:
        super().__init__()
        self.client, self.generation, self.key = client, generation, key
        self.wait_s = timeout
        self.give_up = give_up

    def _call(self, op: str, *args: Any, deadline: float | None = None) -> tuple[Status, Any]:
        deadline = deadline if deadline is not None else time.monotonic() + self.wait_s
        pause, last = POLL_FIRST_S, ""
        while True:
            try:
                status, result = self.client.call(self.generation, self.key, op, list(args))
                if status is Status.REFUSED:
                    raise RendezvousError(f"store {self.client.host}:{self.client.port} refused {op}: {result}")
                if status is not Status.UNKNOWN:
                    return status, result
                last = "its host has not taken up this generation yet"
            except OSError as exc:
                last = f"{exc.strerror or exc}"
            if (reason := self.give_up()) is not None:
                raise reason
            if time.monotonic() + pause > deadline:
                raise dist.DistStoreError(f"store {self.client.host}:{self.client.port}, generation "
                                          f"{self.generation}: no answer for {op} in time ({last})")
            time.sleep(pause)
            pause = min(POLL_MAX_S, pause * 2)

    def _until(self, op: str, *args: Any, timeout: float | None = None) -> Any:
        """Poll op until it finds what it asks for (a key set, every key set) or timeout passes."""
        deadline = time.monotonic() + (self.wait_s if timeout is None else timeout)
        pause = POLL_FIRST_S
        while True:
            status, result = self._call(op, *args, deadline=deadline)
            if status is Status.OK and result is not False:
                return result
            if time.monotonic() + pause > deadline:
                raise dist.DistStoreError(f"store {self.client.host}:{self.client.port}, generation "
                                          f"{self.generation}: {args[0]} not set in time")
            time.sleep(pause)
            pause = min(POLL_MAX_S, pause * 2)

    def set(self, key: str, value: Any) -> None:
        self._call("set", key, _bytes(value))

    def get(self, key: str) -> bytes:
        return self._until("get", key)

    def add(self, key: str, amount: int) -> int:
        return self._call("add", key, int(amount))[1]

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._call("compare_set", key, _bytes(expected), _bytes(desired))[1]

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", list(keys))[1])

    def wait(self, keys: list[str], timeout: dt.timedelta | None = None) -> None:
        self._until("check", list(keys), timeout=None if timeout is None else timeout.total_seconds())

    def delete_key(self, key: str) -> bool:
        return bool(self._call("delete", key)[1])

    def num_keys(self) -> int:
        return int(self._call("num_keys")[1])
