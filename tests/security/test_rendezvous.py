"""The data plane as a stranger meets it (issue 35). The rendezvous store answers only requests
tagged with the generation's key (derived from the secret the leader drew for it), so a stranger on
the store port reads, writes and stalls nothing; once formed, every pair of ranks proves that key
over its own connection, so a stranger who took a rank's place is found before any gradient or heal
piece crosses; the heal stream is authenticated with a key derived from the same secret."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist
import datetime as dt

from dpeer.launch.cluster import free_port_block
from dpeer.trainer import rendezvous_wire as wire
from tests.security.rendezvous_child import SECRET


def start(port: int, *parties: tuple[str, ...], timeout: float = 8.0) -> list[subprocess.Popen]:
    env = {**os.environ, "RENDEZVOUS_CHILD_TIMEOUT": str(timeout)}
    return [subprocess.Popen([sys.executable, "-m", "tests.security.rendezvous_child", role, node, str(port), *rest],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for role, node, *rest in parties]


def answers(procs: list[subprocess.Popen]) -> list[dict]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert stdout.strip(), stderr[-2000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def run(*parties: tuple[str, ...]) -> list[dict]:
    """Start the parties (role, node, secret) against one store port; their JSON answers, in order."""
    return answers(start(free_port_block(1), *parties))


def listening_ports(pid: int) -> set[int]:
    """The TCP ports a process listens on (its sockets' inodes matched in /proc/net/tcp)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
        rows = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return set()
    return {int(r.split()[1].split(":")[1], 16) for r in rows if r.split()[3] == "0A" and r.split()[9] in inodes}


class Stranger(threading.Thread):
    """Connects to every port the parties listen on, again and again, sending what a stranger would:
    nothing, junk, the 8-byte sequence numbers Gloo's listener reads on connect, and a torch
    TCPStore client's first bytes; counts the connections it made."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        super().__init__(daemon=True)
        self.pids, self.stop, self.tries, self.ports = [p.pid for p in procs], threading.Event(), 0, set()

    def run(self) -> None:
        payloads = [b"", os.urandom(64), *[seq.to_bytes(8, "little") for seq in range(8)], os.urandom(70000)]
        while not self.stop.is_set():
            for pid in self.pids:
                for port in listening_ports(pid):
                    self.ports.add(port)
                    for payload in payloads:
                        try:
                            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                                s.sendall(payload)
                                self.tries += 1
                        except OSError:
                            pass
            time.sleep(0.005)


def test_members_who_know_the_secret_form_the_group() -> None:
    a, b = run(("member", "a", SECRET), ("member", "b", SECRET))
    assert a == {"formed": True, "error": "", "rank": 0} and b["formed"] and b["rank"] == 1, (a, b)


def test_a_party_without_the_secret_cannot_join() -> None:
    member, stranger = run(("member", "a", SECRET), ("member", "b", "0" * 32))
    assert not member["formed"] and "1/2 members arrived" in member["error"], member
    assert not stranger["formed"], stranger


def test_a_stranger_on_the_store_port_reads_writes_and_stalls_nothing() -> None:
    """The writes that stalled training for good (`sealed` = abandoned), torch's own store client and
    big values, while member a hosts the store and waits for b, and while both form: they form, and
    every stranger request is refused."""
    port = free_port_block(1)
    procs = start(port, ("member", "a", SECRET), timeout=60.0)  # a waits for b while the stranger tries
    refused, deadline = 0, time.monotonic() + 90

    def attack() -> None:
        nonlocal refused
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                nonce = wire.read_greeting(s.recv(wire.GREETING_BYTES))
                s.sendall(wire.frame(b"guess" * 8, b"q", nonce, [7, 1, "compare_set", ["sealed", b"", b"abandoned"]]))
                s.sendall(wire.frame(b"guess" * 8, b"q", nonce, [7, 2, "set", ["big", os.urandom(200 << 10)]]))
                s.settimeout(5)
                refused += s.recv(1) == b""  # the store closes the connection without an answer
        except (OSError, wire.WireError):
            time.sleep(0.005)  # not listening (yet, or any more)

    while refused < 5 and time.monotonic() < deadline:
        attack()
    try:
        dist.TCPStore("127.0.0.1", port, is_master=False, timeout=dt.timedelta(seconds=2))
        raise AssertionError("torch's store client was served")
    except (RuntimeError, ValueError):
        pass
    procs += start(port, ("member", "b", SECRET), timeout=60.0)
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        attack()
    a, b = answers(procs)
    assert refused >= 5, refused
    assert a == {"formed": True, "error": "", "rank": 0} and b["formed"], (a, b)


def test_a_connection_that_does_not_prove_the_pair_key_fails_the_group() -> None:
    """What a stranger in a rank's place meets: it cannot prove the key it never learned."""
    a, b = run(("pair", "a", "k" * 32), ("pair", "b", "x" * 32))
    assert "rank 1 did not prove" in a["error"] and "rank 0 did not prove" in b["error"], (a, b)
    a, b = run(("pair", "a", "k" * 32), ("pair", "b", "k" * 32))
    assert a == b == {"formed": True, "error": ""}, (a, b)


def test_a_stranger_on_every_data_plane_port_during_formation_and_heal_changes_nothing() -> None:
    """Connections to the store, Gloo's listener and any other port the workers open, while they
    form and heal: the newcomer ends with the donor's exact state, or the group fails naming the
    connection that did not prove the key; never a state the stranger chose."""
    procs = start(free_port_block(1), ("heal", "a", "k" * 32), ("heal", "b", "k" * 32))
    stranger = Stranger(procs)
    stranger.start()
    try:
        donor, receiver = answers(procs)
    finally:
        stranger.stop.set()
        stranger.join(10)
    assert stranger.tries > 0 and len(stranger.ports) >= 2, (stranger.tries, stranger.ports)
    if donor["error"] or receiver["error"]:
        assert "did not prove" in donor["error"] + receiver["error"], (donor, receiver)
    else:
        assert receiver["received"] and receiver["digest"] == donor["digest"], (donor, receiver)


def test_the_heal_stream_is_authenticated_with_the_generations_key() -> None:
    donor, receiver = run(("heal", "a", "k" * 32), ("heal", "b", "k" * 32))
    assert receiver["received"] and receiver["digest"] == donor["digest"], (donor, receiver)
    donor, receiver = run(("heal", "a", "k" * 32), ("heal", "b", "x" * 32))
    assert "authentication tag does not verify" in receiver["error"], receiver


def test_a_healed_state_that_is_not_the_committed_checkpoints_is_refused() -> None:
    """The committed checkpoint's digest came through the log (mutual TLS); a heal to its step must
    end with those parameters, whatever the data plane delivered."""
    donor, receiver = run(("heal", "a", "k" * 32, "0" * 64), ("heal", "b", "k" * 32, "0" * 64))
    assert "not the committed checkpoint's" in receiver["error"] and not donor["error"], (donor, receiver)
