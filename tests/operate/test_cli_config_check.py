"""`dpeer config check` and `dpeer start` agree on a file: check runs the refusals start runs before
its worker (cli/main.py check_security), with the same sentence (review of issue 35: check said "ok"
for an exposed node start refused, so a careless operator installed a file the service then refused)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.daemons import cli_many, one_sentence
from tests.support.pki import Pki, make_pki

OFF_LOOPBACK = "192.0.2.2:40750"  # TEST-NET-1: never bound here; start refuses it or fails to bind it


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def _file(pki: Pki, tmp_path: Path, identity: str | None, extra: dict[str, Any], name: str = "node",
          security: dict[str, Any] | None = None) -> Path:
    """A config of node n2 (a node's certificate and the token when `identity` names one) plus extra,
    and security settings over those."""
    doc = yaml.safe_load(pki.config(f"base-{name}", identity).read_text()) if identity else {"security": {}}
    doc.update({"node_id": "n2", "data_dir": str(tmp_path / "data"), **extra})
    doc["security"].update(security or {})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in doc.items() if v is not None}))
    return path


REFUSED = {
    "secured, a job off loopback, no insecure_data_plane": ("node-n2", {"listen": OFF_LOOPBACK, "job": "demo"},
                                                            "insecure_data_plane"),
    "off loopback without TLS or --insecure": (None, {"listen": OFF_LOOPBACK}, "--insecure"),
    "a certificate naming another node": ("node-n1", {"listen": "127.0.0.1:40751"}, "names node/n1, not node/n2"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_config_check_refuses_what_start_refuses_with_its_sentence(pki: Pki, tmp_path: Path, case: str) -> None:
    identity, extra, expected = REFUSED[case]
    path = _file(pki, tmp_path, identity, extra)
    started, checked = cli_many([["start", "--config", str(path)], ["config", "check", str(path)]])
    reason = one_sentence(started.stderr).removeprefix("dpeer: ")
    assert started.returncode == 2 and expected in reason, started.stderr
    assert checked.returncode == 2, f"config check said {checked.stdout.strip()!r} for a file start refuses: {reason}"
    assert one_sentence(checked.stderr) == f"dpeer: {path}: {reason}"


def test_what_start_allows_passes_config_check(pki: Pki, tmp_path: Path) -> None:
    """Off loopback with security.insecure and no job, or secured with insecure_data_plane: ok. A
    secured file without node_id is checked without the certificate's name (start takes the id from
    --node-id and checks it then)."""
    paths = [_file(pki, tmp_path, None, {"listen": OFF_LOOPBACK}, "insecure", {"insecure": True}),
             _file(pki, tmp_path, "node-n2", {"listen": OFF_LOOPBACK, "job": "demo"}, "data-plane",
                   {"insecure_data_plane": True}),
             _file(pki, tmp_path, "node-n2", {"listen": "127.0.0.1:40752", "job": "demo", "node_id": None}, "no-id")]
    for path, done in zip(paths, cli_many([["config", "check", str(p)] for p in paths])):
        assert done.returncode == 0 and done.stdout.strip() == f"{path}: ok", (path.name, done.stderr)
