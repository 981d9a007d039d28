"""The driver of the bytes counted across sites (dpeer/daemon/serve/site_bytes.py) against a
hostile environment: a reading that fails never reaches the daemon's chores, a resolver that
hangs never holds the process's exit."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import textwrap
from types import SimpleNamespace

from dpeer.daemon.decide.cross_site import Reading
from dpeer.daemon.serve.site_bytes import SiteBytes


def node(sites: dict[str, str], addrs: dict[str, str]) -> SimpleNamespace:
    members = {n: SimpleNamespace(addr=addrs[n], site=sites[n]) for n in sites}
    return SimpleNamespace(id="a", reads=SimpleNamespace(state=SimpleNamespace(view=None, members=members)))


def beat(counter: SiteBytes) -> None:
    """One metrics beat: the last reading added, the next taken (its thread waited for, so the next
    beat adds it)."""
    counter.read()
    if counter._reading is not None:
        counter._reading.exception(timeout=30)


def test_a_reading_that_fails_is_skipped_not_raised(caplog) -> None:
    """The metrics' beat runs in the chores: an exception there would end the daemon's loop."""
    calls = []

    def broken(inodes):
        calls.append(set(inodes))
        raise struct.error("unpack_from requires a buffer of at least 140 bytes")

    counter = SiteBytes(node({"a": "lab", "b": "cloud"}, {"a": "10.0.0.1:7100", "b": "10.1.0.1:7100"}), None, broken)
    for _ in range(3):
        beat(counter)
    assert len(calls) == 3 and counter.counts.document()["daemon"] == {"sent": 0, "received": 0}
    assert sum("cannot count the bytes crossing sites" in r.getMessage() for r in caplog.records) == 1


def test_only_the_processes_own_sockets_are_asked_for() -> None:
    asked = []

    def connections(inodes):
        asked.append(set(inodes))
        return {i: Reading("10.1.0.1", 1, 1) for i in inodes}

    counter = SiteBytes(node({"a": "lab", "b": "cloud"}, {"a": "10.0.0.1:7100", "b": "[::ffff:10.1.0.1]:7100"}),
                        None, connections)
    held = socket.socketpair()
    with held[0], held[1]:
        beat(counter)
        counter.read()
        assert asked and {os.fstat(s.fileno()).st_ino for s in held} <= asked[0]
    assert counter.counts.document()["daemon"]["sent"] >= 2  # the v4-mapped peer's address is far


def test_a_resolver_that_hangs_never_holds_the_process_exit() -> None:
    script = textwrap.dedent("""
        import socket, time
        from types import SimpleNamespace
        socket.getaddrinfo = lambda *a, **k: time.sleep(60)
        from dpeer.daemon.serve.site_bytes import SiteBytes
        members = {"a": SimpleNamespace(addr="10.0.0.1:1", site="lab"),
                   "b": SimpleNamespace(addr="far.invalid:1", site="x")}
        node = SimpleNamespace(id="a", reads=SimpleNamespace(state=SimpleNamespace(view=None, members=members)))
        counter = SiteBytes(node, None, lambda inodes: {})
        counter.read()
        time.sleep(0.2)
        counter.close()
    """)
    done = subprocess.run([sys.executable, "-c", script], timeout=30, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
