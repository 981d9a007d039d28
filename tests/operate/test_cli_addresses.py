"""Reaching a node as etcdctl's users expect: --addr and DPEER_ADDR take a list and fail over to
the next address; something else answering at an address (another gRPC service, an HTTP/2 or
HTTP/1 server) is exit 3 with a sentence naming it; under --json every error is one JSON object
{error, exit_code} on stderr."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from concurrent import futures
from typing import Iterator

import grpc
import pytest

from tests.support.daemons import cli, cli_many, formed, one_sentence

HTTP2_NOT_FOUND = b"\x8d"  # HPACK: the static table's ":status: 404"


def _answer_http2(conn: socket.socket) -> None:
    """Speak just enough HTTP/2 to answer every request with status 404 (a web server without gRPC)."""
    with conn:
        conn.recv(24)  # the client's connection preface
        conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # our SETTINGS
        buf = b""
        while data := conn.recv(65536):
            buf += data
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                size, kind, flags = int.from_bytes(buf[:3], "big"), buf[3], buf[4]
                stream = buf[5:9]
                buf = buf[9 + size:]
                if kind == 4 and not flags & 1:  # their SETTINGS: acknowledge
                    conn.sendall(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00")
                elif kind == 1:  # a request's HEADERS: answer 404, END_STREAM | END_HEADERS
                    conn.sendall(len(HTTP2_NOT_FOUND).to_bytes(3, "big") + b"\x01\x05" + stream + HTTP2_NOT_FOUND)


@pytest.fixture
def http2_server() -> Iterator[str]:
    """An HTTP/2 server on loopback that is no gRPC server."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_answer_http2, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


@pytest.fixture
def other_grpc() -> Iterator[str]:
    """A gRPC server of another service (it serves no dpeer method)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        """Not on the test's stderr."""


class _Server(http.server.ThreadingHTTPServer):
    request_queue_size = 64  # every client at once, without a dropped connect to retry


@pytest.fixture
def http1_server() -> Iterator[str]:
    """A plain HTTP/1 server (as a metrics port is)."""
    server = _Server(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_another_server_answering_is_exit_3_naming_what_answered(http2_server: str, other_grpc: str,
                                                                  http1_server: str) -> None:
    expected = {http2_server: "it is an HTTP/2 server that does not speak gRPC (it answered HTTP status 404)",
                other_grpc: "it is a gRPC server that does not serve this dpeer call",
                http1_server: "it is a server that does not speak HTTP/2"}
    # a generous timeout: the servers answer from this busy process, while nine clients start at once
    commands = [[*c, "--addr", addr, "--timeout", "30"] for addr in expected
                for c in (["status"], ["kv", "put", "k", "v"], ["job", "retry"])]
    for command, result in zip(commands, cli_many(commands)):
        addr = command[command.index("--addr") + 1]
        line = one_sentence(result.stderr)
        assert result.returncode == 3, (command, result.returncode, result.stderr)
        assert f"{addr} answered, but not as a dpeer node: {expected[addr]}" in line, line
        assert "point --addr at a dpeer node's gRPC address" in line and result.stdout == "", line


ANSWERS = {  # (gRPC code, details) -> the start of what the sentence says answered (None: a node's own answer)
    ("UNIMPLEMENTED", "Method not found!"): "a gRPC server that does not serve this dpeer call",
    ("UNIMPLEMENTED", "Received http2 header with status: 404"): "an HTTP/2 server that does not speak gRPC (it "
                                                                 "answered HTTP status 404)",
    ("UNAVAILABLE", "Received http2 header with status: 503"): "an HTTP/2 server that does not speak gRPC (it "
                                                               "answered HTTP status 503)",
    ("UNKNOWN", "No status received"): "an HTTP/2 server that does not speak gRPC (its answer carried no gRPC status)",
    ("UNAVAILABLE", "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:9: Failed parsing "
                    "HTTP/2 (Expected SETTINGS frame as the first frame, got frame type 80)"):
        "a server that does not speak HTTP/2",
    ("UNAVAILABLE", "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9: Connection refused"):
        None,
    ("NOT_FOUND", "key 'k' is not set"): None,
    ("UNKNOWN", "the store failed"): None,
}


@pytest.mark.parametrize("code,details", sorted(ANSWERS))
def test_what_answered_tells_a_stranger_from_a_node(code: str, details: str) -> None:
    from dpeer.transport.client import what_answered

    said, expected = what_answered(code, details), ANSWERS[(code, details)]
    assert said == expected if expected is None else said is not None and said.startswith(expected), said


def json_error(result) -> dict:
    """The one JSON object a failed --json command wrote on stderr, checked against its exit code."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    error = json.loads(lines[0])
    assert set(error) == {"error", "exit_code"} and error["exit_code"] == result.returncode != 0, error
    return error


def test_every_error_under_json_is_one_json_object(daemons, tmp_path, http2_server: str) -> None:
    free = f"127.0.0.1:{daemons.port()}"
    missing = str(tmp_path / "absent.yaml")
    offline = {  # no node is needed to fail these
        ("status", "--json", "--bogus"): (2, "unrecognized arguments: --bogus"),
        ("stauts", "--json"): (2, "did you mean 'status'?"),
        ("kv", "put", "k", "--json", "--addr", free): (2, "give the value as VALUE"),
        ("config", "check", missing, "--json"): (2, "cannot read the config file"),
        ("config", "show", "--json", "--config", missing): (2, "cannot read the config file"),
        ("log", "--from", "0", "--json", "--addr", free): (2, "--from and --to are log indexes"),
        ("demo", "--nodes", "0", "--json"): (2, "--nodes must be between 1 and 9"),
        ("certs", "create-node", "n1", "--dir", str(tmp_path / "nowhere"), "--json"): (2, "no CA in"),
        ("status", "--json", "--addr", free, "--timeout", "2"): (3, f"node {free} refused the connection"),
        ("members", "--json", "--addr", http2_server, "--timeout", "30"): (3, "not as a dpeer node"),
        ("leave", "--json", "--addr", f"{free},{http2_server}"): (2, "acts on the node it addresses"),
    }
    for command, result in zip(offline, cli_many([list(c) for c in offline])):
        code, text = offline[command]
        error = json_error(result)
        assert result.returncode == code and text in error["error"], (command, result.returncode, error)
        if command[:2] != ("config", "check"):  # check prints its {file, ok, error} answer on stdout too
            assert result.stdout == "", (command, result.stdout)
    n1 = daemons.start("n1")
    formed(n1.addr, {"n1"})
    negative = {
        ("kv", "get", "never-set"): "key 'never-set' is not set",
        ("kv", "delete", "never-set"): "key 'never-set' is not set",
        ("job", "retry"): "not retried: there is no job to retry",
        ("log", "--to", "100000"): "entries after",
        ("leave", "--node", "n9"): "not removed: n9 is not a member that n1 knows",
    }
    results = cli_many([[*c, "--json", "--addr", n1.addr] for c in negative])
    for (command, text), result in zip(negative.items(), results):
        error = json_error(result)
        assert result.returncode == 1 and text in error["error"], (command, error)
    get, delete, log = results[0], results[1], results[3]
    assert json.loads(get.stdout) == {"key": "never-set", "found": False, "value": None}  # the answer stays
    assert json.loads(delete.stdout)["found"] is False
    assert all(json.loads(line)["index"] >= 1 for line in log.stdout.splitlines())


def test_an_address_list_fails_over_to_the_next_node(daemons, http2_server: str) -> None:
    n1 = daemons.start("n1")
    formed(n1.addr, {"n1"})
    dead = f"127.0.0.1:{daemons.port()}"  # nothing listens: the kernel refuses
    listed = f"{dead},{http2_server},{n1.addr}"
    put = cli("kv", "put", "team", "ml", "--addr", listed, "--timeout", "30")
    assert put.returncode == 0 and "committed at index" in put.stdout, put.stderr
    status, members, get = cli_many([["status", "--json", "--addr", listed, "--timeout", "30"], ["members", "--json"],
                                     ["kv", "get", "team", "--json"]], env={"DPEER_ADDR": f"{dead}, {n1.addr}"})
    assert status.returncode == 0 and json.loads(status.stdout)["node_id"] == "n1", status.stderr
    rows = json.loads(members.stdout)
    assert [(r["node_id"], r["kind"], r["role"], r["rank"], r["step"]) for r in rows] == [
        ("n1", "voter", "leader", 0, None)], rows
    assert json.loads(get.stdout) == {"key": "team", "found": True, "value": "ml"}, get.stderr
    # every address failing: one sentence naming each one's failure
    none = cli("status", "--addr", f"{dead},{http2_server}", "--timeout", "30")
    line = one_sentence(none.stderr)
    assert none.returncode == 3, none
    assert f"no node in --addr answered: node {dead} refused the connection; {http2_server} answered, but not as a " \
           "dpeer node" in line and line.endswith("is a daemon running at one of them?"), line
    # a command that acts on the addressed node itself takes one address only
    leave, force = cli_many([["leave"], ["force", "--voters", "n1", "--yes"]], env={"DPEER_ADDR": f"{dead},{n1.addr}"})
    for result, name in ((leave, "leave"), (force, "force")):
        assert result.returncode == 2 and f"DPEER_ADDR names 2 nodes, but `dpeer {name}` acts on the node it " \
            "addresses" in one_sentence(result.stderr), result
    assert n1.running
