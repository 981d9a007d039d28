"""`dpeer certs`: a cluster's CA, node and client certificates and its token, made with `cryptography`.

Identity lives in a URI subject alternative name, in the manner of SPIFFE IDs:
``dpeer://node/ID`` for a node, ``dpeer://operator/NAME`` for an operator and
``dpeer://client/NAME`` for a read-only client. A URI cannot be mistaken for a host name (a CN
or DNS name can), RFC 6125 deprecates the CN for identity, and the role travels with the name,
so one CA can sign all three kinds. Node certificates also carry the DNS name ``dpeer``, which
every client checks (boxes move between addresses), and any ``--host`` given; client
certificates carry no DNS name, so they cannot pose as a node's server.

Keys are EC P-256, written 0600 with the token, in a directory made 0700 (an existing one is left
as it is); certificates are 0644. No file is ever overwritten: an existing one is an error.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpeer.security.auth import TLS_SERVER_NAME, CallerRole, Principal, identity_uri
from dpeer.security.proof import identity
CA_CERT, CA_KEY, TOKEN_FILE = "ca.pem", "ca.key", "cluster.token"
CA_DAYS, LEAF_DAYS = 3650, 825


class CertError(ValueError):
    """A certificate could not be made: a file exists, the CA is missing, a name is unusable."""


@dataclass(frozen=True)
class Written:
    """The files one command wrote."""

    cert: Path
    key: Path


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create path with data and mode; refuses to replace an existing file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise CertError(f"{path} already exists; dpeer never overwrites keys or certificates "
                        "(move it aside or choose another --dir)") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)  # O_CREAT's mode is filtered by the umask


def _private_dir(directory: Path) -> None:
    """Make directory (and missing parents) 0700: only its owner may list or enter it. An existing
    one keeps its mode (a deployment's 0750 with a group, say); the keys in it are 0600 anyway."""
    if not directory.is_dir():
        directory.mkdir(mode=0o700, parents=True)
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask


def _refuse_existing(*paths: Path) -> None:
    for path in paths:
        if path.exists():
            raise CertError(f"{path} already exists; dpeer never overwrites keys or certificates "
                            "(move it aside or choose another --dir)")


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)  # tolerate small clock skew


def create_ca(directory: Path, name: str = "dpeer cluster CA", days: int = CA_DAYS) -> tuple[Written, Path]:
    """A self-signed CA (ca.pem, ca.key) and a random cluster token (cluster.token) in directory."""
    _private_dir(directory)
    cert_path, key_path, token_path = directory / CA_CERT, directory / CA_KEY, directory / TOKEN_FILE
    _refuse_existing(cert_path, key_path, token_path)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(_now())
        .not_valid_after(_now() + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_new(key_path, _key_pem(key), 0o600)
    _write_new(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write_new(token_path, (secrets.token_urlsafe(32) + "\n").encode(), 0o600)
    return Written(cert_path, key_path), token_path


def _load_ca(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = ca_dir / CA_CERT, ca_dir / CA_KEY
    if not cert_path.is_file() or not key_path.is_file():
        raise CertError(f"no CA in {ca_dir} (expected {CA_CERT} and {CA_KEY}); run `dpeer certs create-ca` first")
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"the CA in {ca_dir} cannot be read: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{key_path} is not an EC key made by `dpeer certs create-ca`")
    return cert, key


def _check_name(name: str) -> None:
    ok = 0 < len(name) <= 64 and name[0].isalnum() and all(c.isalnum() or c in "._-" for c in name)
    if not ok:
        raise CertError(f"{name!r} is not a usable name: 1-64 letters, digits, '.', '_' or '-', starting alphanumeric")


def _host_names(hosts: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in hosts:
        try:
            out.append(x509.IPAddress(ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def _issue(ca_dir: Path, out_dir: Path, stem: str, role: CallerRole, name: str, hosts: list[str], days: int) -> Written:
    _check_name(name)
    ca_cert, ca_key = _load_ca(ca_dir)
    _private_dir(out_dir)
    cert_path, key_path = out_dir / f"{stem}.pem", out_dir / f"{stem}.key"
    _refuse_existing(cert_path, key_path)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity_uri(role, name))]
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role is CallerRole.NODE:
        sans += [x509.DNSName(TLS_SERVER_NAME), *_host_names(hosts)]
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                                 x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role.value)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(_now())
        .not_valid_after(min(_now() + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_new(key_path, _key_pem(key), 0o600)
    _write_new(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return Written(cert_path, key_path)


def create_node(ca_dir: Path, out_dir: Path, node_id: str, hosts: list[str], days: int = LEAF_DAYS) -> Written:
    """node-ID.pem / node-ID.key: a node certificate naming dpeer://node/ID (and DNS:dpeer, the hosts)."""
    return _issue(ca_dir, out_dir, f"node-{node_id}", CallerRole.NODE, node_id, hosts, days)


def create_client(ca_dir: Path, out_dir: Path, name: str, operator: bool, days: int = LEAF_DAYS) -> Written:
    """operator-NAME or client-NAME .pem/.key: a client certificate; operators may change the cluster."""
    role = CallerRole.OPERATOR if operator else CallerRole.CLIENT
    return _issue(ca_dir, out_dir, f"{role.value}-{name}", role, name, [], days)


def identity_of(pem: bytes) -> Principal:
    """The dpeer identity a PEM certificate names (its dpeer:// URI); role UNKNOWN when none."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise CertError(f"not a PEM certificate: {exc}") from None
    return identity(cert)


def check_pair(cert_pem: bytes, key_pem: bytes) -> None:
    """CertError unless key_pem is an unencrypted PEM private key whose public key is cert_pem's:
    a key copied from another certificate otherwise fails only at the first TLS handshake, where
    gRPC reports it as an address it cannot listen on or a node it cannot reach."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise CertError(f"the certificate is not a PEM certificate: {exc}") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise CertError("the key is encrypted; dpeer needs it unencrypted (0600 protects it)") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise CertError(f"the key is not a PEM private key: {exc}") from None
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise CertError("the key does not belong to the certificate (their public keys differ)")
