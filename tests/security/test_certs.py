"""`dpeer certs`: what it writes, with which modes and identities, and what it refuses."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509

from dpeer.security import certs
from dpeer.security.auth import TLS_SERVER_NAME, CallerRole, Principal
from tests.support.daemons import cli, one_sentence


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_cli_makes_a_ca_token_node_and_clients_with_private_keys_0600(tmp_path: Path) -> None:
    d = tmp_path / "pki"
    made = [cli("certs", "create-ca", "--dir", str(d)),
            cli("certs", "create-node", "n1", "--host", "10.0.0.1", "--host", "box1.lan", "--dir", str(d)),
            cli("certs", "create-client", "alice", "--operator", "--dir", str(d)),
            cli("certs", "create-client", "bob", "--dir", str(d))]
    assert all(r.returncode == 0 for r in made), [r.stderr for r in made]
    for name in ("ca.key", "cluster.token", "node-n1.key", "operator-alice.key", "client-bob.key"):
        assert mode(d / name) == 0o600, name
    assert len((d / "cluster.token").read_text().strip()) >= 40
    node = x509.load_pem_x509_certificate((d / "node-n1.pem").read_bytes())
    sans = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == ["dpeer://node/n1"]
    assert set(sans.get_values_for_type(x509.DNSName)) == {TLS_SERVER_NAME, "box1.lan"}
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.1"]
    assert certs.identity_of((d / "node-n1.pem").read_bytes()) == Principal(CallerRole.NODE, "n1")
    assert certs.identity_of((d / "operator-alice.pem").read_bytes()) == Principal(CallerRole.OPERATOR, "alice")
    assert certs.identity_of((d / "client-bob.pem").read_bytes()) == Principal(CallerRole.CLIENT, "bob")
    client = x509.load_pem_x509_certificate((d / "client-bob.pem").read_bytes())
    client_sans = client.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert client_sans.get_values_for_type(x509.DNSName) == [], "a client certificate must not pose as a node"


def test_nothing_is_overwritten_and_mistakes_are_one_sentence(tmp_path: Path) -> None:
    d = tmp_path / "pki"
    certs.create_ca(d)
    key_before = (d / "ca.key").read_bytes()
    certs.create_node(d, d, "n1", [])
    node_key = (d / "node-n1.key").read_bytes()
    refused = [cli("certs", "create-ca", "--dir", str(d)),
               cli("certs", "create-node", "n1", "--dir", str(d)),
               cli("certs", "create-node", "n2", "--dir", str(tmp_path / "out"), "--ca-dir", str(tmp_path / "nowhere")),
               cli("certs", "create-node", "bad id!", "--dir", str(d)),
               cli("certs", "create-client", "x", "--days", "0", "--dir", str(d))]
    for result, needle in zip(refused, ("already exists", "already exists", "no CA", "not a usable name", "--days")):
        assert result.returncode == 2, (result.args, result.stderr)
        assert needle in one_sentence(result.stderr)
    assert (d / "ca.key").read_bytes() == key_before and (d / "node-n1.key").read_bytes() == node_key
    assert not (tmp_path / "out" / "node-n2.pem").exists()


def test_a_certificate_without_a_dpeer_identity_names_no_role(tmp_path: Path) -> None:
    with pytest.raises(certs.CertError):
        certs.identity_of(b"not a certificate")
    d = tmp_path / "pki"
    certs.create_ca(d)
    assert certs.identity_of((d / "ca.pem").read_bytes()).role is CallerRole.UNKNOWN


def test_check_pair_accepts_a_certificate_with_its_own_key_only(tmp_path: Path) -> None:
    certs.create_ca(tmp_path)
    n1, n2 = (certs.create_node(tmp_path, tmp_path, n, []) for n in ("n1", "n2"))
    certs.check_pair(n1.cert.read_bytes(), n1.key.read_bytes())
    with pytest.raises(certs.CertError, match="does not belong to the certificate"):
        certs.check_pair(n1.cert.read_bytes(), n2.key.read_bytes())
    with pytest.raises(certs.CertError, match="not a PEM private key"):
        certs.check_pair(n1.cert.read_bytes(), n1.cert.read_bytes())
    with pytest.raises(certs.CertError, match="not a PEM certificate"):
        certs.check_pair(n1.key.read_bytes(), n1.key.read_bytes())
