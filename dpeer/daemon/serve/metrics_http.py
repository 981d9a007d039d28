"""The /metrics HTTP server: prometheus-client's WSGI app behind a server of bounded cost.

prometheus-client's own start_http_server starts a thread per connection, with no timeout, and
with TLS it handshakes inside accept(), so one silent client stops every scrape. Here at most
MAX_CONNECTIONS connections are served at once, each on a thread of its own that handshakes
(TLS: a client certificate of the cluster CA is required, as start_http_server's
client_auth_required=True asks) and reads under IDLE_S per read and DEADLINE_S in all; one more
is closed at once. 300 idle sockets thus hold MAX_CONNECTIONS threads for DEADLINE_S at most.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

MAX_CONNECTIONS = 8  # a Prometheus server or two scrape a node; more at once is a flood
IDLE_S = 5.0  # the longest a connection may stay silent (handshake, request)
DEADLINE_S = 10.0  # the longest a connection is kept, however slowly it trickles
REAP_EVERY_S = 0.5  # how often the accept loop closes connections past their deadline


@dataclass(frozen=True)
class MetricsTLS:
    """The node's certificate and key, and the CA whose client certificates may read /metrics."""

    cert: Path
    key: Path
    ca: Path

    def context(self) -> ssl.SSLContext:
        """A server context that requires a client certificate signed by the CA (TLS 1.2 or later)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert), str(self.key))
        context.load_verify_locations(cafile=str(self.ca))
        context.verify_mode = ssl.CERT_REQUIRED
        return context


class _Quiet(WSGIRequestHandler):
    """No access log on stderr (the daemon's logs are JSON lines)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        """Nothing."""


class MetricsServer(WSGIServer):
    """/metrics on (host, port): plain HTTP, or TLS with client certificates; bounded as the
    module says. serve_forever() runs it, shutdown() and server_close() end it."""

    request_queue_size = 64  # the listen backlog: connections the kernel holds until they are accepted or closed

    def __init__(self, host: str, port: int, registry: CollectorRegistry, tls: MetricsTLS | None = None,
                 max_connections: int = MAX_CONNECTIONS, idle_s: float = IDLE_S, deadline_s: float = DEADLINE_S) -> None:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self.address_family = family
        self._context = tls.context() if tls is not None else None
        self._slots = threading.BoundedSemaphore(max_connections)
        self._idle_s, self._deadline_s = idle_s, deadline_s
        self._open: dict[int, tuple[socket.socket, float]] = {}  # id -> (its socket now, its deadline)
        self._lock = threading.Lock()
        self.turned_away = 0  # connections closed at once: every slot was taken
        super().__init__((host, port), _Quiet)
        self.set_app(make_wsgi_app(registry))

    def serve(self) -> threading.Thread:
        """Serve from a daemon thread (the process's exit ends it); the thread."""
        thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": REAP_EVERY_S},
                                  name="dpeer-metrics", daemon=True)
        thread.start()
        return thread

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on a thread of its own, or close it at once when every slot is taken."""
        if not self._slots.acquire(blocking=False):
            self.turned_away += 1
            self.shutdown_request(request)
            return
        key = id(request)
        with self._lock:
            self._open[key] = (request, time.monotonic() + self._deadline_s)
        threading.Thread(target=self._serve_one, args=(key, request, client_address), daemon=True).start()

    def _serve_one(self, key: int, request: socket.socket, client_address: Any) -> None:
        try:
            request.settimeout(self._idle_s)
            if self._context is not None:
                request = self._context.wrap_socket(request, server_side=True)  # handshakes, under the timeout
                with self._lock:
                    self._open[key] = (request, self._open[key][1])  # the reaper cuts the TLS socket now
            self.finish_request(request, client_address)
        except OSError:  # a refused certificate, a silent or vanished client: nothing to answer
            pass
        finally:
            with self._lock:
                self._open.pop(key, None)
            self.shutdown_request(request)
            self._slots.release()

    def service_actions(self) -> None:
        """Between accepts: cut the connections past their deadline (their thread then ends)."""
        now = time.monotonic()
        with self._lock:
            late = [sock for sock, deadline in self._open.values() if deadline <= now]
        for sock in late:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def connections(self) -> int:
        """Connections being served now."""
        with self._lock:
            return len(self._open)
