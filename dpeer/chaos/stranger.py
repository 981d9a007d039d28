"""A stranger on the data plane: connections to a worker's listening ports, from outside the group.

The chaos run's `stranger` fault (and, while the first group forms, a stranger at every node in
turn) speaks the rendezvous store's own wire, with guessed keys, to the store its status names
(`group.store_host`; dpeer/chaos/store_probe.py: `sealed` set to "abandoned", a get of it and a
value of the largest size, for the current generation and the next two); sends the worker's store
port (`worker.store_port`) a TCPStore-style SET of `<prefix>/sealed` (torch's store, which
answered anyone, is what a stranger would expect there) and random bytes; and connects to every
other TCP port the worker's process listens on (its Gloo and heal listeners: the process's sockets in LISTEN state, from
/proc/<pid>/fd and /proc/<pid>/net/tcp{,6}), sending random bytes. The group must shrug it off:
the store refuses every request (the row "stranger's store requests refused"), training goes on
and the run's checks (the ledger audit, the final model equal to the fault-free run) still pass.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

from dpeer.chaos.store_probe import NEXT_GENERATIONS, Outcome, probe, probes

LISTEN = "0A"  # the TCP state column of /proc/net/tcp
VALIDATE, SET = 0, 1  # torch's TCPStore query types (TCPStoreBackend.hpp)
MAGIC = 0x3C85F7CE  # its validation number
CONNECT_TIMEOUT = 1.0


@dataclass
class Tally:
    """What the stranger did, for the report: connections made and refused, bytes sent, the
    store SETs, the ports it reached (node:port), by phase (formation or training); its requests
    on the store's wire by outcome, and each one the store ran."""

    connections: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    sent: int = 0
    store_sets: int = 0
    ports: set[str] = field(default_factory=set)
    requests: dict[str, int] = field(default_factory=lambda: {o.value: 0 for o in Outcome})
    ran: list[str] = field(default_factory=list)

    def note(self) -> str:
        """One line: what the stranger did in the run."""
        phases = ", ".join(f"{n} during {p}" for p, n in sorted(self.connections.items())) or "none"
        return (f"stranger on the data plane: {sum(self.connections.values())} connections ({phases}) to "
                f"{len(self.ports)} worker ports, {self.store_sets} TCPStore SETs of <prefix>/sealed, "
                f"{self.sent} bytes sent, {self.refused} connections refused; {self.requests_note()}")

    def requests_note(self) -> str:
        """What the store did with the stranger's requests under guessed keys."""
        r = self.requests
        return (f"{sum(r.values())} store requests under guessed keys (sealed set to \"abandoned\", a get of it, "
                f"a 256 KiB value; for the current generation and the next {NEXT_GENERATIONS}): "
                f"{r[Outcome.REFUSED.value]} refused, {r[Outcome.NOT_SERVED.value]} answered \"generation not "
                f"served\", {r[Outcome.SILENT.value]} unanswered (no store served there), {r[Outcome.RAN.value]} run")

    def answered(self) -> int:
        """Requests a store met (refused, not served or ran): 0 means the row checked nothing."""
        return sum(n for o, n in self.requests.items() if o != Outcome.SILENT.value)


def store_set(key: str, value: bytes) -> bytes:
    """A TCPStore client's first bytes and one SET: validate, then key and value, each length-prefixed."""
    raw = key.encode()
    return (struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<B", SET)
            + struct.pack("<Q", len(raw)) + raw + struct.pack("<Q", len(value)) + value)


def parse_listening(table: str, inodes: set[str]) -> list[tuple[str | None, int]]:
    """The (host, port) of every LISTEN socket in a /proc/net/tcp or tcp6 table whose inode is in
    `inodes`; host None for a wildcard address."""
    out: list[tuple[str | None, int]] = []
    for line in table.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or cols[3] != LISTEN or cols[9] not in inodes:
            continue
        hex_host, hex_port = cols[1].split(":")
        raw = b"".join(bytes.fromhex(hex_host[i:i + 8])[::-1] for i in range(0, len(hex_host), 8))
        addr = ipaddress.ip_address(raw)
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        out.append((None if addr.is_unspecified else str(addr), int(hex_port, 16)))
    return out


def listening_ports(pid: int) -> list[tuple[str | None, int]]:
    """The TCP ports process `pid` listens on ([] when it is gone or cannot be read)."""
    proc = Path(f"/proc/{pid}")
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return []
    inodes = set()
    for fd in fds:
        try:
            link = os.readlink(fd)
        except OSError:
            continue  # closed since the listing
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    found: list[tuple[str | None, int]] = []
    for table in ("tcp", "tcp6"):
        try:
            found += parse_listening((proc / "net" / table).read_text(), inodes)
        except OSError:
            continue
    return sorted(set(found), key=lambda hp: (hp[1], hp[0] or ""))


async def visit(tally: Tally, phase: str, node_id: str, host: str, pid: int, store_port: int,
                rng: random.Random) -> None:
    """Connect to every port the worker `pid` listens on: the store port gets a TCPStore SET of
    `<prefix>/sealed` and random bytes, every other port random bytes."""
    for bound, port in listening_ports(pid):
        target = bound or host
        if target.startswith("127.") and not host.startswith("127."):
            continue  # a loopback listener in another network namespace: out of a stranger's reach
        if port == store_port:
            prefix = f"stranger-{rng.getrandbits(32):08x}"
            if await _send(tally, phase, target, port, store_set(f"{prefix}/sealed", b"abandoned")):
                tally.store_sets += 1
        if await _send(tally, phase, target, port, rng.randbytes(rng.randint(16, 4096))):
            tally.ports.add(f"{node_id}:{port}")


async def speak_the_wire(tally: Tally, phase: str, store: str, generation: int | None, rng: random.Random) -> None:
    """Requests on the store's own wire under guessed keys, one connection each, to the store the
    status names (`group.store_host`, HOST:PORT: what a read-only client sees); `generation`: the
    view's. The rest are skipped once the port does not greet, so a visit stays short."""
    host, _, port = store.rpartition(":")
    host = host.strip("[]")
    for g, key, op, args in probes(generation, rng):
        try:
            outcome, sent = await probe(host, int(port), g, key, op, args, CONNECT_TIMEOUT)
        except (OSError, TimeoutError):
            tally.refused += 1
            return
        tally.connections[phase] = tally.connections.get(phase, 0) + 1
        tally.sent += sent
        tally.requests[outcome.value] += 1
        if outcome is Outcome.RAN:
            tally.ran.append(f"the store at {store} ran a stranger's {op} for generation {g} during {phase}")
        if outcome is Outcome.SILENT:
            return


async def _send(tally: Tally, phase: str, host: str, port: int, payload: bytes) -> bool:
    """Connect, send, close; False when the connection was refused or timed out."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT)
    except (OSError, TimeoutError):
        tally.refused += 1
        return False
    tally.connections[phase] = tally.connections.get(phase, 0) + 1
    try:
        writer.write(payload)
        await asyncio.wait_for(writer.drain(), CONNECT_TIMEOUT)
        tally.sent += len(payload)
    except (OSError, TimeoutError):
        pass  # the worker hung up first: refusing a stranger is allowed
    finally:
        writer.close()
    return True
