"""The proof a forwarded command carries (dpeer/security/proof.py): made with the caller's own key,
checked by the leader against the cluster CA, the caller it names, the request it receives, its
clock and the nonces it has seen; and the rule that only a command beyond the forwarding node's own
rights needs one (auth.beyond_the_node). Pure: no daemon, no network."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.security import auth, certs, proof
from dpeer.security.auth import CallerRole as Role, Principal
from tests.support.pki import Pki

ALICE = Principal(Role.OPERATOR, "alice")
NONCE = bytes(range(16))
NOW = time.time()


@pytest.fixture(autouse=True)
def fresh_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOW, when proofs are made and checked, is read as each test starts: the pki fixture's
    certificates are valid from 5 minutes before they are made, so a NOW read when this module
    was collected falls before them once a session has run longer."""
    monkeypatch.setitem(globals(), "NOW", time.time())


def signer(pki: Pki, stem: str, other_ca: bool = False) -> proof.Signer:
    cert, key = pki.files(stem, other_ca)
    return proof.Signer(cert.read_bytes(), key.read_bytes())


def verifier(pki: Pki) -> proof.Verifier:
    return proof.Verifier(pki.ca.read_bytes())


def put(value: str = "v") -> pb.KvPutRequest:
    return pb.KvPutRequest(key="k", value=value)


def test_an_operators_own_proof_of_the_very_request_is_accepted(pki: Pki) -> None:
    header = signer(pki, "operator-alice").sign("KvPut", put(), NOW, NONCE)
    assert verifier(pki).check(header, "KvPut", put(), ALICE, NOW + 30) is None
    # the leader rebuilds the encoding from what it receives: fields at their defaults are absent
    join = pb.JoinRequest(node_id="n3", addr="127.0.0.1:1", store_port=0, ready=True, uid="a" * 32)
    header = signer(pki, "node-n3").sign("Join", join, NOW, NONCE)
    again = pb.JoinRequest(node_id="n3", addr="127.0.0.1:1", ready=True, uid="a" * 32)
    assert verifier(pki).check(header, "Join", again, Principal(Role.NODE, "n3"), NOW) is None


def test_a_missing_or_malformed_proof_is_refused_with_its_reason(pki: Pki) -> None:
    check = verifier(pki).check
    assert "no proof from operator/alice's own certificate" in (check(None, "KvPut", put(), ALICE, NOW) or "")
    header = signer(pki, "operator-alice").sign("KvPut", put(), NOW, NONCE)
    for bad in ("", "junk", "2" + header[1:], header.replace(".", ".x", 1), header[:-8] + "!!!!!!!!", "1" * 9000):
        assert "malformed" in (check(bad, "KvPut", put(), ALICE, NOW) or ""), bad


def test_a_stale_or_future_proof_is_refused(pki: Pki) -> None:
    header = signer(pki, "operator-alice").sign("KvPut", put(), NOW, NONCE)
    for now in (NOW + proof.FRESH_S + 1, NOW - proof.FRESH_S - 1):
        why = verifier(pki).check(header, "KvPut", put(), ALICE, now) or ""
        assert "off this node's clock" in why and "NTP" in why, why


def test_an_expired_certificate_proves_nothing(pki: Pki, tmp_path: Path) -> None:
    expired = certs.create_client(pki.root / "ca", tmp_path, "alice", operator=True, days=0)
    header = proof.Signer(expired.cert.read_bytes(), expired.key.read_bytes()).sign("KvPut", put(), NOW, NONCE)
    why = verifier(pki).check(header, "KvPut", put(), ALICE, NOW) or ""
    assert "certificate is valid only from" in why, why


def test_a_certificate_of_another_ca_proves_nothing(pki: Pki, tmp_path: Path) -> None:
    other = certs.create_client(pki.root / "other", tmp_path, "alice", operator=True)
    header = proof.Signer(other.cert.read_bytes(), other.key.read_bytes()).sign("KvPut", put(), NOW, NONCE)
    why = verifier(pki).check(header, "KvPut", put(), ALICE, NOW) or ""
    assert "not issued by this cluster's CA" in why, why


def test_a_node_certificate_cannot_prove_an_operator(pki: Pki) -> None:
    header = signer(pki, "node-n2").sign("KvPut", put(), NOW, NONCE)
    assert verifier(pki).check(header, "KvPut", put(), ALICE, NOW) == "its proof is signed by node/n2, not operator/alice"
    evil = Principal(Role.OPERATOR, "evil")
    assert "not operator/evil" in (verifier(pki).check(header, "KvPut", put(), evil, NOW) or "")


def test_a_proof_does_not_cover_another_request(pki: Pki) -> None:
    header = signer(pki, "operator-alice").sign("KvPut", put("v"), NOW, NONCE)
    check = verifier(pki).check
    mismatch = "signature does not match the request"
    assert mismatch in (check(header, "KvPut", put("w"), ALICE, NOW) or ""), "a changed value"
    assert mismatch in (check(header, "KvDelete", pb.KvDeleteRequest(key="k"), ALICE, NOW) or ""), "another method"
    # the time and nonce are signed too
    time_ms = header.split(".")[1]
    moved = header.replace(f".{time_ms}.", f".{int(time_ms) + 1000}.", 1)
    assert mismatch in (check(moved, "KvPut", put("v"), ALICE, NOW) or "")
    other_nonce = header.replace(NONCE.hex(), "f" * 32, 1)
    assert mismatch in (check(other_nonce, "KvPut", put("v"), ALICE, NOW) or "")


def test_a_proof_is_accepted_once(pki: Pki) -> None:
    check = verifier(pki).check
    header = signer(pki, "operator-alice").sign("KvPut", put(), NOW, NONCE)
    assert check(header, "KvPut", put(), ALICE, NOW) is None
    assert "used before (a replay)" in (check(header, "KvPut", put(), ALICE, NOW + 1) or "")
    fresh = signer(pki, "operator-alice").sign("KvPut", put(), NOW, bytes(16))
    assert check(fresh, "KvPut", put(), ALICE, NOW + 1) is None, "a new nonce is a new proof"


def test_a_command_that_failed_may_be_tried_again_with_its_proof(pki: Pki) -> None:
    """A forwarding node tries a command again while the leader has no quorum: the nonce the
    failed attempt took is let go (Guard.failed), nothing else's."""
    gate = verifier(pki)
    header = signer(pki, "operator-alice").sign("KvPut", put(), NOW, NONCE)
    assert gate.check(header, "KvPut", put(), ALICE, NOW) is None
    gate.forget(header, Principal(Role.OPERATOR, "bob"))
    assert "used before" in (gate.check(header, "KvPut", put(), ALICE, NOW) or ""), "another signer's nonce"
    gate.forget(header, ALICE)
    assert gate.check(header, "KvPut", put(), ALICE, NOW) is None
    gate.forget("junk", ALICE)  # a malformed header forgets nothing and raises nothing


def test_the_nonces_held_are_bounded_and_expire(pki: Pki) -> None:
    gate = proof.Verifier(pki.ca.read_bytes(), max_nonces=2)
    alice = signer(pki, "operator-alice")
    proofs = [alice.sign("KvPut", put(), NOW, bytes([i]) * 16) for i in range(4)]
    assert gate.check(proofs[0], "KvPut", put(), ALICE, NOW) is None
    assert gate.check(proofs[1], "KvPut", put(), ALICE, NOW) is None
    assert "try again in a minute" in (gate.check(proofs[2], "KvPut", put(), ALICE, NOW) or "")
    later = alice.sign("KvPut", put(), NOW + 2 * proof.FRESH_S, bytes([9]) * 16)
    assert gate.check(later, "KvPut", put(), ALICE, NOW + 2 * proof.FRESH_S) is None, "expired nonces make room"


def test_only_a_call_beyond_the_forwarding_nodes_own_rights_needs_a_proof() -> None:
    n2 = Principal(Role.NODE, "n2")
    mode = auth.Mode.MTLS_TOKEN

    def beyond(method: str, request: object, named: Principal) -> bool:
        return auth.beyond_the_node(mode, method, request, auth.Caller(named, via=n2))

    assert beyond("KvPut", put(), ALICE), "a node may not put, so an operator's put needs the operator's proof"
    assert beyond("JobControl", pb.JobControlRequest(action="pause"), ALICE)
    assert beyond("Leave", pb.LeaveRequest(node_id="n1", forwarded=True), ALICE), "another node's leave"
    assert beyond("Join", pb.JoinRequest(node_id="n3"), Principal(Role.NODE, "n3")), "another node's join"
    assert not beyond("KvGet", pb.KvGetRequest(key="k"), Principal(Role.CLIENT, "bob")), "a node may read"
    assert not beyond("Leave", pb.LeaveRequest(node_id="n2", forwarded=True), ALICE), "the node's own leave"
    assert not auth.beyond_the_node(mode, "KvPut", put(), auth.Caller(ALICE)), "a direct call needs no proof"
    assert auth.SIGNED == {"Join", "Leave", "GroupFailed", "ReportCheckpoint", "KvPut", "KvDelete", "JobControl"}


@pytest.mark.parametrize("method", sorted(auth.SIGNED))
def test_every_signed_command_encodes_every_field_it_sets(method: str) -> None:
    """A field the canonical encoding left out could be changed by the forwarding node unseen."""
    from dpeer.transport.server import _TYPES

    request = _TYPES[method][0]()
    for field in request.DESCRIPTOR.fields:
        if field.is_repeated:
            getattr(request, field.name).append("x")
        elif field.type == field.TYPE_BOOL:
            setattr(request, field.name, True)
        elif field.type == field.TYPE_STRING:
            setattr(request, field.name, "x")
        else:
            setattr(request, field.name, 7)
    doc = proof.canonical(method, request, 1, "0" * 32).decode()
    assert all(f'"{field.name}":' in doc for field in request.DESCRIPTOR.fields), doc


def test_the_guard_takes_a_proof_once_and_again_after_the_command_failed(pki: Pki) -> None:
    from dpeer.transport.server import Guard

    guard = Guard(pki.security("node-n1"), wall=lambda: NOW)
    n2 = Principal(Role.NODE, "n2")
    header = signer(pki, "operator-alice").sign("KvPut", put(), NOW, NONCE)
    forwarded = auth.Caller(ALICE, via=n2, proof=header)
    assert guard.proven(forwarded, "KvPut", put(), "n1") == forwarded
    refused = guard.proven(forwarded, "KvPut", put(), "n1")
    assert isinstance(refused, tuple) and refused[0] is auth.Refusal.FORBIDDEN
    assert refused[1].startswith("the leader (n1) refused KvPut forwarded by n2 for operator/alice: its proof was used")
    guard.failed(forwarded)  # the handler failed (no quorum): n2 tries again with the same proof
    assert guard.proven(forwarded, "KvPut", put(), "n1") == forwarded
    evil = guard.proven(auth.Caller(Principal(Role.OPERATOR, "evil"), via=n2), "KvPut", put(), "n1")
    assert evil == (auth.Refusal.FORBIDDEN, "the leader (n1) refused KvPut forwarded by n2 for operator/evil: no proof "
                    "from operator/evil's own certificate came with it (a node's certificate alone grants no operator "
                    "rights)")
    own_leave = auth.Caller(ALICE, via=n2, proof=header)
    assert guard.proven(own_leave, "Leave", pb.LeaveRequest(node_id="n2", forwarded=True), "n1") == auth.Caller(n2), \
        "a node's own leave needs no proof and stands as the node's"
