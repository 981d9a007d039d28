"""A cluster's PKI made with `dpeer certs` (the library behind it), the configs, client flags and
raw gRPC channels that use it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import yaml

from dpeer.security import certs
from dpeer.daemon import config as cfg
from dpeer.transport.options import TLS_SERVER_NAME, Security, channel_options

NODES = ("n1", "n2", "n3")


@dataclass
class Pki:
    """One cluster's CA and token, node certificates n1..n3, an operator and a read-only client, and
    a second CA (a stranger's) with a node certificate of its own."""

    root: Path

    @property
    def ca(self) -> Path:
        return self.root / "ca" / certs.CA_CERT

    @property
    def token(self) -> Path:
        return self.root / "ca" / certs.TOKEN_FILE

    def files(self, stem: str, other_ca: bool = False) -> tuple[Path, Path]:
        d = self.root / ("other" if other_ca else "ca")
        return d / f"{stem}.pem", d / f"{stem}.key"

    def config(self, name: str, stem: str | None, token: bool = True, other_ca: bool = False,
               extra: dict | None = None) -> Path:
        """A YAML config holding the identity `stem` (e.g. node-n1, operator-alice) and the token."""
        security: dict[str, str] = {}
        if stem is not None:
            cert, key = self.files(stem, other_ca)
            security.update(tls_cert=str(cert), tls_key=str(key), tls_ca=str(self.ca))
        if token:
            security["cluster_token_file"] = str(self.token)
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"security": security, **(extra or {})}))
        return path

    def security(self, stem: str | None, token: bool = True, other_ca: bool = False) -> Security:
        """The client-side Security of identity `stem` (None: no certificate)."""
        s = cfg.load(self.config(f"client-{stem}-{token}-{other_ca}", stem, token, other_ca), environ={}).security
        return Security.from_files(s.tls_cert, s.tls_key, s.tls_ca, s.cluster_token_file)


def make_pki(root: Path) -> Pki:
    """Everything Pki names, written under root."""
    ca, other = root / "ca", root / "other"
    certs.create_ca(ca)
    certs.create_ca(other, name="a stranger's CA")
    for node in NODES:
        certs.create_node(ca, ca, node, ["127.0.0.1"])
    certs.create_client(ca, ca, "alice", operator=True)
    certs.create_client(ca, ca, "bob", operator=False)
    certs.create_node(other, other, "n1", ["127.0.0.1"])  # the right name, the wrong CA
    return Pki(root)


def operator_flags(pki: Pki) -> list[str]:
    """The client flags of the operator alice."""
    cert, key = pki.files("operator-alice")
    return ["--tls-ca", str(pki.ca), "--tls-cert", str(cert), "--tls-key", str(key), "--token-file", str(pki.token)]


def channel(addr: str, pki: Pki, stem: str | None, other_ca: bool = False, tls: bool = True) -> grpc.aio.Channel:
    """A raw channel: plaintext, TLS without a client certificate (stem None), or with the identity stem."""
    if not tls:
        return grpc.aio.insecure_channel(addr, options=channel_options())
    key = cert = None
    if stem is not None:
        cert_path, key_path = pki.files(stem, other_ca)
        cert, key = cert_path.read_bytes(), key_path.read_bytes()
    creds = grpc.ssl_channel_credentials(pki.ca.read_bytes(), key, cert)
    return grpc.aio.secure_channel(addr, creds, options=[*channel_options(),
                                                          ("grpc.ssl_target_name_override", TLS_SERVER_NAME)])
