"""The nonces a leader keeps of forwarded calls' proofs (security/proof.py, the Guard in
transport/server.py) cannot be spent to lock an operator out (issue 35's review): a proof of a
caller who may not make the call is refused before its nonce is kept, each signer holds at most
its own share, and nodes' proofs are held apart from operators'. Pure: no daemon, no network."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.security import auth, certs, proof
from dpeer.security.auth import CallerRole as Role, Principal
from dpeer.transport.server import Guard
from tests.support.pki import Pki

ALICE = Principal(Role.OPERATOR, "alice")
N2 = Principal(Role.NODE, "n2")
NOW = time.time()


@pytest.fixture(autouse=True)
def fresh_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOW, when proofs are made and checked, is read as each test starts: the pki fixture's
    certificates are valid from 5 minutes before they are made, so a NOW read when this module
    was collected falls before them once a session has run longer."""
    monkeypatch.setitem(globals(), "NOW", time.time())


def signer(pki: Pki, stem: str) -> proof.Signer:
    cert, key = pki.files(stem)
    return proof.Signer(cert.read_bytes(), key.read_bytes())


def nonce(i: int) -> bytes:
    return i.to_bytes(16, "big")


def put() -> pb.KvPutRequest:
    return pb.KvPutRequest(key="k", value="v")


def join(node_id: str) -> pb.JoinRequest:
    return pb.JoinRequest(node_id=node_id, addr="127.0.0.1:1", uid="a" * 32)


def test_refused_callers_proofs_do_not_lock_out_the_operator(pki: Pki) -> None:
    """The reviewer's reproduction: a member node and a read-only client's key forward
    MAX_NONCES puts "for client/bob"; each is refused, and the operator's own put still passes."""
    guard = Guard(pki.security("node-n1"), wall=lambda: NOW)
    bob = Principal(Role.CLIENT, "bob")
    signed = signer(pki, "client-bob")
    for i in range(proof.MAX_NONCES):
        forwarded = auth.Caller(bob, via=N2, proof=signed.sign("KvPut", put(), NOW, nonce(i)))
        got = guard.proven(forwarded, "KvPut", put(), "n1")
        assert got == (auth.Refusal.FORBIDDEN, "KvPut is an operator command and client/bob holds no operator "
                       "certificate"), got
    operator = auth.Caller(ALICE, via=N2, proof=signer(pki, "operator-alice").sign("KvPut", put(), NOW, b"\xaa" * 16))
    got = guard.proven(operator, "KvPut", put(), "n1")
    assert got == operator, f"the operator's own forwarded put was refused: {got}"


def test_a_refused_callers_proof_keeps_no_nonce(pki: Pki) -> None:
    """Nothing the leader can refuse comes after the nonce is kept: n3's proof of a join in n4's
    name is refused for its rights and keeps its nonce free, so n3's own join under the same
    nonce is no replay."""
    guard = Guard(pki.security("node-n1"), wall=lambda: NOW)
    n3 = signer(pki, "node-n3")
    forged = auth.Caller(Principal(Role.NODE, "n3"), via=N2, proof=n3.sign("Join", join("n4"), NOW, nonce(2)))
    assert guard.proven(forged, "Join", join("n4"), "n1") == (auth.Refusal.IDENTITY, "node 'n3' may not speak for 'n4'")
    own = auth.Caller(Principal(Role.NODE, "n3"), via=N2, proof=n3.sign("Join", join("n3"), NOW, nonce(2)))
    assert guard.proven(own, "Join", join("n3"), "n1") == own, "the refused proof's nonce was kept"


def test_a_signer_over_its_share_is_refused_and_no_one_else(pki: Pki, tmp_path: Path) -> None:
    gate = proof.Verifier(pki.ca.read_bytes(), max_nonces=100, max_per_signer=3)
    alice = signer(pki, "operator-alice")
    for i in range(3):
        assert gate.check(alice.sign("KvPut", put(), NOW, nonce(i)), "KvPut", put(), ALICE, NOW) is None
    why = gate.check(alice.sign("KvPut", put(), NOW, nonce(3)), "KvPut", put(), ALICE, NOW) or ""
    assert why == ("this node holds 3 fresh proofs of operator/alice already (the most for one caller within a "
                   "minute); try again in a minute"), why
    carol = certs.create_client(pki.root / "ca", tmp_path, "carol", operator=True)
    header = proof.Signer(carol.cert.read_bytes(), carol.key.read_bytes()).sign("KvPut", put(), NOW, nonce(3))
    assert gate.check(header, "KvPut", put(), Principal(Role.OPERATOR, "carol"), NOW) is None, \
        "another operator is not refused for alice's proofs"
    later = NOW + 2 * proof.FRESH_S
    assert gate.check(alice.sign("KvPut", put(), later, nonce(4)), "KvPut", put(), ALICE, later) is None, \
        "alice's stale proofs make room for her new ones"
    assert gate.held(Role.OPERATOR) == 2, "alice's three stale nonces went, carol's and the new one stay"


def test_nodes_proofs_never_crowd_out_an_operators(pki: Pki) -> None:
    """Node certificates are many (every box's, retired boxes' too); however many proofs they
    make, an operator's nonces are held apart."""
    gate = proof.Verifier(pki.ca.read_bytes(), max_nonces=4, max_per_signer=2)
    for i, node in enumerate(("n1", "n1", "n2", "n2")):
        header = signer(pki, f"node-{node}").sign("Join", join(node), NOW, nonce(i))
        assert gate.check(header, "Join", join(node), Principal(Role.NODE, node), NOW) is None
    header = signer(pki, "node-n3").sign("Join", join("n3"), NOW, nonce(9))
    why = gate.check(header, "Join", join("n3"), Principal(Role.NODE, "n3"), NOW) or ""
    assert why == "this node holds 4 fresh proofs of nodes already; try again in a minute", why
    operator = signer(pki, "operator-alice").sign("KvPut", put(), NOW, nonce(9))
    assert gate.check(operator, "KvPut", put(), ALICE, NOW) is None, "the operator locked out by nodes' proofs"
    later = NOW + 2 * proof.FRESH_S
    header = signer(pki, "node-n3").sign("Join", join("n3"), later, nonce(10))
    assert gate.check(header, "Join", join("n3"), Principal(Role.NODE, "n3"), later) is None, "stale ones make room"
    assert gate.held(Role.NODE) == 1


def test_a_forgotten_nonce_frees_its_place(pki: Pki) -> None:
    gate = proof.Verifier(pki.ca.read_bytes(), max_nonces=100, max_per_signer=1)
    alice = signer(pki, "operator-alice")
    first, second = (alice.sign("KvPut", put(), NOW, nonce(i)) for i in range(2))
    assert gate.check(first, "KvPut", put(), ALICE, NOW) is None
    assert "fresh proofs of operator/alice" in (gate.check(second, "KvPut", put(), ALICE, NOW) or "")
    gate.forget(first, ALICE)  # the command failed there (no quorum)
    assert gate.held(Role.OPERATOR) == 0
    assert gate.check(second, "KvPut", put(), ALICE, NOW) is None
