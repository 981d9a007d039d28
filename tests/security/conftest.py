"""A cluster's PKI made with `dpeer certs` (the library behind it), and configs that use it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from dpeer.security import certs
from dpeer.daemon import config as cfg
from dpeer.transport.options import Security
from tests.operate.conftest import daemons, pytest_runtest_makereport  # noqa: F401 (fixture, hook)

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


@pytest.fixture
def pki(tmp_path: Path) -> Iterator[Pki]:
    """A fresh PKI in the test's temp dir."""
    yield make_pki(tmp_path / "pki")
