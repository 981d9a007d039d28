"""The rendezvous store a rank-0 worker serves on its store port, in place of torch's TCPStore.

TCPStore answers anyone who connects: a stranger could list, read, write and delete the keys a
group forms from, and grow the worker without bound (issue 35). This server answers only requests
tagged with the key of a generation it was told it hosts (rendezvous_wire), keeps each generation's
keys in a bounded table (rendezvous_table), and spends a bounded amount on everyone else: at most
MAX_UNPROVEN connections that never proved a key at once (the oldest is closed to make room; those
that proved one, the members', are not counted, so a group of any size meets), a frame of at most
MAX_FRAME bytes, one answer to a connection that asks about a generation not hosted here before it
proved a key (then it is closed), and a connection that sends nothing authentic within
UNPROVEN_IDLE_S is closed. A frame that fails its tag, or replays a counter, closes its connection.
One thread, one selector: a flood costs one core's share at most, never a thread per connection.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from dpeer.trainer import rendezvous_wire as wire
from dpeer.trainer.rendezvous_table import RendezvousTable, Status

log = logging.getLogger("dpeer.trainer.rendezvous")
MAX_UNPROVEN = 64
MAX_UNSENT = 64 << 10  # replies a client has not read yet; beyond, it is closed
UNPROVEN_IDLE_S = 10.0
IDLE_S = 300.0
SWEEP_S = 1.0


@dataclass
class _Conn:
    sock: socket.socket
    fd: int
    nonce: bytes
    opened: float
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    counter: int = 0  # the last authentic request's
    proven: bool = False
    active: float = 0.0


class RendezvousServer:
    """Serves the generations `allow` names on a bound, listening socket, from its own thread."""

    def __init__(self, sock: socket.socket) -> None:
        self._listen = sock
        self._listen.setblocking(False)
        self._table = RendezvousTable()
        self._keys: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self._conns: dict[int, _Conn] = {}
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listen, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._stopped = False
        self.refused = 0  # connections closed for a frame that was not authentic or well-formed
        self._thread = threading.Thread(target=self._run, name="dpeer-rendezvous", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The port it serves."""
        return self._listen.getsockname()[1]

    def allow(self, generation: int, key: bytes) -> None:
        """Serve generation's requests tagged with key (dropping the oldest beyond the table's keep)."""
        with self._lock:
            self._keys[generation] = key
            for dropped in self._table.allow(generation):
                self._keys.pop(dropped, None)

    def close(self) -> None:
        """Stop serving and close every connection and the listening socket."""
        self._stopped = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=5.0)

    # -- the loop --------------------------------------------------------------------------
    def _run(self) -> None:
        swept = time.monotonic()
        try:
            while not self._stopped:
                for selected, mask in self._sel.select(timeout=SWEEP_S):
                    if selected.fileobj is self._listen:
                        self._accept()
                    elif selected.fileobj is not self._wake_r:
                        self._ready(selected.fileobj, mask)  # type: ignore[arg-type]
                now = time.monotonic()
                if now - swept >= SWEEP_S:
                    self._sweep(now)
                    swept = now
        finally:
            for fd in list(self._conns):
                self._drop(fd)
            for s in (self._listen, self._wake_r, self._wake_w):
                s.close()
            self._sel.close()

    def _accept(self) -> None:
        try:
            sock, _ = self._listen.accept()
        except OSError:
            return
        unproven = [c for c in self._conns.values() if not c.proven]
        if len(unproven) >= MAX_UNPROVEN:
            self._drop(min(unproven, key=lambda c: c.opened).fd)  # the oldest stranger makes room
        nonce, now = os.urandom(wire.NONCE_BYTES), time.monotonic()
        sock.setblocking(False)
        conn = _Conn(sock, sock.fileno(), nonce, now, active=now)
        self._conns[conn.fd] = conn
        self._sel.register(sock, selectors.EVENT_READ)
        self._send(conn, wire.greeting(nonce))

    def _sweep(self, now: float) -> None:
        for fd, conn in list(self._conns.items()):
            if now - conn.active > (IDLE_S if conn.proven else UNPROVEN_IDLE_S):
                self._drop(fd)

    def _drop(self, fd: int) -> None:
        conn = self._conns.pop(fd, None)
        if conn is not None:
            self._sel.unregister(conn.sock)
            conn.sock.close()

    def _ready(self, sock: socket.socket, mask: int) -> None:
        conn = self._conns.get(sock.fileno())
        if conn is None:
            return
        if mask & selectors.EVENT_WRITE:
            self._send(conn, b"")
        if mask & selectors.EVENT_READ and conn.fd in self._conns:
            self._readable(conn)

    def _send(self, conn: _Conn, data: bytes) -> None:
        """Queue data and send what the socket takes now; a client that leaves more than MAX_UNSENT
        unread is closed (it is no member waiting for its answer)."""
        conn.outbuf += data
        try:
            sent = conn.sock.send(conn.outbuf) if conn.outbuf else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(conn.fd)
            return
        del conn.outbuf[:sent]
        if len(conn.outbuf) > MAX_UNSENT:
            self._refuse(conn, f"{len(conn.outbuf)} bytes of answers left unread")
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        self._sel.modify(conn.sock, events)

    def _readable(self, conn: _Conn) -> None:
        sock = conn.sock
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn.fd)
            return
        conn.inbuf += data
        try:
            self._serve_frames(conn)
        except (wire.WireError, OSError) as exc:
            self._refuse(conn, str(exc))

    def _serve_frames(self, conn: _Conn) -> None:
        while len(conn.inbuf) >= wire.LEN_BYTES:
            length = wire.frame_length(bytes(conn.inbuf[:wire.LEN_BYTES]))
            if len(conn.inbuf) < wire.LEN_BYTES + length:
                return
            payload = bytes(conn.inbuf[wire.LEN_BYTES:wire.LEN_BYTES + length])
            del conn.inbuf[:wire.LEN_BYTES + length]
            self._send(conn, self._answer(conn, payload))
            if conn.fd not in self._conns:
                return
            if not conn.proven:  # it asked about a generation not hosted here: one answer, then closed
                self._drop(conn.fd)
                return

    def _answer(self, conn: _Conn, payload: bytes) -> bytes:
        mac, body, message = wire.split(payload)
        if len(message) != 4 or type(message[0]) is not int or type(message[1]) is not int:
            raise wire.WireError("a request is [generation, counter, op, args]")
        generation, counter, op, args = message
        with self._lock:
            key = self._keys.get(generation)
            if key is None:
                return wire.frame(None, b"r", conn.nonce, [counter, Status.UNKNOWN.value, None])
            if not wire.verify(key, b"q", conn.nonce, mac, body):
                raise wire.WireError(f"a request for generation {generation} does not carry its key's tag")
            if counter != conn.counter + 1:
                raise wire.WireError(f"request {counter} out of order (expected {conn.counter + 1}): a replay")
            conn.counter, conn.proven, conn.active = counter, True, time.monotonic()
            status, result = self._table.apply(generation, op, args if type(args) is list else [None])
        return wire.frame(key, b"r", conn.nonce, [counter, status.value, result])

    def _refuse(self, conn: _Conn, why: str) -> None:
        self.refused += 1
        if self.refused & (self.refused - 1) == 0:  # the 1st, 2nd, 4th, 8th...: a flood cannot fill the log
            log.warning("rendezvous store: closed a connection (%d so far): %s", self.refused, why)
        self._drop(conn.fd)
