"""A 3-node cluster made with `dpeer certs` trains the demo job over mutual TLS, its data plane (the
rendezvous store and Gloo) bound to each node's own configured address only; operator commands
without the operator credential are refused, with it they work."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

from tests.support.daemons import WAIT, cli, cli_many, formed, one_sentence, wait_status
from tests.support.pki import Pki

STEPS = 600  # enough that n2 and n3 join before n1, which trains alone at first, finishes (a loaded box)


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process pid listens on (IPv4 and IPv6)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:
                continue
            host, port = local.split(":")
            raw = bytes.fromhex(host)
            if width == 8:
                addr = socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(host, 16)))
            else:
                ip6 = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                addr = str(ip6.ipv4_mapped or ip6)  # gRPC binds a dual-stack socket to ::ffff:127.0.0.1
            out.add((addr, int(port, 16)))
    return out


def test_a_three_node_mtls_cluster_trains_and_refuses_non_operators(daemons, pki: Pki) -> None:
    training = {"training": {"steps": STEPS, "checkpoint_every": 200}}
    hosts = {"n1": "127.0.0.1", "n2": "127.0.0.2", "n3": "127.0.0.3"}
    nodes = []
    for node_id, host in hosts.items():
        conf = pki.config(node_id, f"node-{node_id}", extra=training)
        listen = f"{host}:{daemons.port()}"
        nodes.append(daemons.start(node_id, listen=listen, config=conf, extra=["--job", "demo"],
                                   join=[nodes[0].addr] if nodes else []))
    operator = pki.security("operator-alice")
    doc = formed(nodes[0].addr, set(hosts), security=operator)
    assert doc["security"]["mode"] == "mtls+token"

    # While the group trains, every worker listens on its own node's address only (store, Gloo),
    # and so does every daemon (gRPC).
    training_docs = {n.node_id: wait_status(n.addr, lambda d: (d["train"] or {}).get("step", 0) >= 1 and
                                            d["worker"]["pid"] is not None, f"{n.node_id} training",
                                            security=operator) for n in nodes}
    for n in nodes:
        worker = training_docs[n.node_id]["worker"]["pid"]
        bound = listening(worker) | listening(n.proc.pid)
        assert bound, f"{n.node_id}'s worker and daemon listen nowhere"
        assert {addr for addr, _ in bound} == {hosts[n.node_id]}, (n.node_id, bound)
    rank0 = training_docs["n1"]["group"]["store_host"]
    assert rank0.rsplit(":", 1)[0] in hosts.values(), rank0

    done = wait_status(nodes[1].addr, lambda d: (d.get("job") or {}).get("state") == "finished",
                       "the job to finish over mutual TLS", timeout=WAIT * 4, security=operator)
    assert done["job"]["step"] == STEPS, done["job"]

    # Operator commands: refused to a read-only client, however it asks and whichever node it asks.
    bob_cert, bob_key = pki.files("client-bob")
    alice_cert, alice_key = pki.files("operator-alice")
    common = ["--tls-ca", str(pki.ca), "--token-file", str(pki.token)]
    bob = [*common, "--tls-cert", str(bob_cert), "--tls-key", str(bob_key)]
    alice = [*common, "--tls-cert", str(alice_cert), "--tls-key", str(alice_key)]
    n3 = nodes[2]
    refused = cli_many([["kv", "put", "lr", "0.5", "--addr", nodes[1].addr, *bob],
                        ["leave", "--addr", n3.addr, *bob],
                        ["force", "--addr", nodes[0].addr, "--voters", "n1", "--yes", *bob]])
    for result in refused:
        assert result.returncode == 1, (result.args, result.stderr)
        line = one_sentence(result.stderr)
        assert "refused" in line and "operator" in line, line
    read = cli("kv", "get", "lr", "--addr", n3.addr, *bob)
    assert read.returncode == 1 and "not set" in read.stderr, read.stderr  # reads are allowed, and nothing was put
    assert n3.running
    put = cli("kv", "put", "lr", "0.5", "--addr", nodes[1].addr, *alice)  # a follower forwards it as alice's
    assert put.returncode == 0, put.stderr
    got = cli("kv", "get", "lr", "--addr", n3.addr, *bob)
    assert got.returncode == 0 and got.stdout.strip() == "0.5", got.stderr
    left = cli("leave", "--addr", n3.addr, *alice)
    assert left.returncode == 0, left.stderr
    assert n3.wait_exit(WAIT) == 0
    wait_status(nodes[0].addr, lambda d: {m["node_id"]: m["committed"] for m in d["members"]}.get("n3") == "left",
                "n3's leave to be committed", security=operator)
