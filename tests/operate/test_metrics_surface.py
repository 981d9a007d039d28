"""/metrics as a surface (issue 35, finding 6): over TLS with client certificates of the cluster CA
when the node has TLS, plain HTTP only on loopback (or --insecure), and a bounded cost: idle or
trickling connections hold at most MAX_CONNECTIONS threads, for DEADLINE_S at most."""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge

from dpeer.daemon.serve.metrics_http import MAX_CONNECTIONS, MetricsServer, MetricsTLS
from dpeer.transport.options import TLS_SERVER_NAME
from tests.support.daemons import Daemons, cli_many, formed, one_sentence, wait_until
from tests.support.pki import Pki, make_pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def registry() -> CollectorRegistry:
    r = CollectorRegistry()
    Gauge("dpeer_test_value", "a value to scrape", registry=r).set(7)
    return r


def serving(server: MetricsServer) -> Iterator[str]:
    server.serve()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def client_context(pki: Pki, stem: str | None, other_ca: bool = False) -> ssl.SSLContext:
    """A scraper's TLS: the cluster CA, the server name every node certificate carries, a client
    certificate (stem) or none."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if stem is not None:
        cert, key = pki.files(stem, other_ca)
        context.load_cert_chain(str(cert), str(key))
    return context


def scrape_tls(addr: str, context: ssl.SSLContext) -> str:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=TLS_SERVER_NAME) as tls:
            tls.sendall(b"GET /metrics HTTP/1.0\r\nHost: dpeer\r\n\r\n")
            chunks = []
            while chunk := tls.recv(65536):
                chunks.append(chunk)
    reply = b"".join(chunks).decode()
    assert reply.startswith("HTTP/1.0 200"), reply[:200]
    return reply


def scrape_plain(addr: str) -> str:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as reply:
        return reply.read().decode()


def test_idle_connections_hold_at_most_the_cap_of_threads_and_are_cut_in_time() -> None:
    # idle_s well past the time 300 connects take on a loaded box: were it shorter, the held ones
    # would be cut while the last connects arrive, and fewer than the cap would refill the slots
    server = MetricsServer("127.0.0.1", 0, registry(), idle_s=12.0, deadline_s=20.0)
    for addr in serving(server):
        before = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", server.server_address[1])) for _ in range(300)]
        try:
            wait_until(lambda: server.connections == MAX_CONNECTIONS and server.turned_away > 0, 30,
                       "the cap of connections taken and the rest turned away")
            peak = max(threading.active_count() for _ in range(50))
            assert peak <= before + MAX_CONNECTIONS, (before, peak)
            assert server.connections <= MAX_CONNECTIONS
            # the silent ones are cut after idle_s: a scrape gets through again
            wait_until(lambda: server.connections == 0, 60, "the idle connections cut")
            assert "dpeer_test_value 7.0" in scrape_plain(addr)
        finally:
            for sock in idle:
                sock.close()


def test_a_trickling_connection_is_cut_at_its_deadline() -> None:
    server = MetricsServer("127.0.0.1", 0, registry(), idle_s=1.0, deadline_s=2.0)
    for addr in serving(server):
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as slow:
            started = time.monotonic()
            cut = False
            for byte in b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 200:  # a byte every 0.3 s: never idle 1 s
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    cut = True
                    break
                if not cut and server.connections == 0:
                    cut = True
                    break
                time.sleep(0.3)  # pacing the trickle, not waiting for a condition
            assert cut, "a trickle outlived its deadline"
            assert time.monotonic() - started < 2.0 + 3.0


def test_tls_metrics_need_a_client_certificate_of_the_cluster_ca(pki: Pki) -> None:
    cert, key = pki.files("node-n1")
    server = MetricsServer("127.0.0.1", 0, registry(), MetricsTLS(cert, key, pki.ca))
    for addr in serving(server):
        with socket.create_connection(("127.0.0.1", server.server_address[1])):  # silent: blocks nobody
            assert "dpeer_test_value 7.0" in scrape_tls(addr, client_context(pki, "operator-alice"))
            assert "dpeer_test_value 7.0" in scrape_tls(addr, client_context(pki, "client-bob"))
        for refused in (client_context(pki, None), client_context(pki, "node-n1", other_ca=True)):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                scrape_tls(addr, refused)
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            scrape_plain(addr)


def task_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_a_tls_node_serves_metrics_to_certificates_only_with_bounded_threads(daemons: Daemons, pki: Pki) -> None:
    metrics = f"127.0.0.1:{daemons.port()}"
    n1 = daemons.start("n1", config=pki.config("n1", "node-n1", extra={"metrics_listen": metrics}))
    formed(n1.addr, {"n1"}, security=pki.security("operator-alice"))
    body = wait_until(lambda: scrape_tls(metrics, client_context(pki, "client-bob")), 30, "a scrape with bob's cert")
    assert 'dpeer_members{node="n1",state="alive"} 1.0' in body
    with pytest.raises((ssl.SSLError, ConnectionError)):
        scrape_tls(metrics, client_context(pki, None))
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape_plain(metrics)
    said = [line["msg"] for line in n1.log_lines() if "/metrics" in str(line.get("msg"))]
    assert said == [f"serving /metrics on https://{metrics}/metrics: TLS, readable with a client certificate "
                    "of the cluster CA (dpeer certs create-client)"], said

    before = task_count(n1.proc.pid)
    host, port = metrics.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port))) for _ in range(300)]
    try:
        peak, until = before, time.monotonic() + 1.5
        while time.monotonic() < until:  # sampled while the idle ones are held (5 s)
            peak = max(peak, task_count(n1.proc.pid))
        assert before < peak <= before + MAX_CONNECTIONS + 2, (before, peak)  # 2: the daemon's own come and go
    finally:
        for sock in idle:
            sock.close()


def test_metrics_in_clear_off_loopback_are_refused_by_config_check(tmp_path: Path, pki: Pki) -> None:
    def config(name: str, security: dict) -> str:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"metrics_listen": "10.0.0.1:7190", "security": security}))
        return str(path)

    tls = yaml.safe_load(pki.config("tls", "node-n1").read_text())["security"]
    no_tls, plain, with_tls = cli_many([["config", "check", config("none", {})],
                                        ["config", "check", config("plain", {**tls, "metrics_plain": True})],
                                        ["config", "check", config("tls", tls)]])
    assert no_tls.returncode == 2 and "has no TLS to serve /metrics with" in one_sentence(no_tls.stderr)
    assert plain.returncode == 2 and "must be a loopback address" in one_sentence(plain.stderr)
    assert with_tls.returncode == 0, with_tls.stderr
