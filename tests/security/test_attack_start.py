"""Outside tester's finding: a node whose tls_key does not belong to its tls_cert (a copy-paste
slip when the files are copied to a box) is refused with "cannot listen on HOST:PORT: the address
is in use or not on this machine", which sends the operator after the wrong problem. Fails while so."""

from __future__ import annotations

from pathlib import Path

from tests.operate.conftest import cli
from tests.security.conftest import Pki


def test_a_key_that_does_not_match_the_certificate_is_named_as_such(tmp_path: Path, pki: Pki) -> None:
    cert, _ = pki.files("node-n1")
    _, other_key = pki.files("node-n2")
    config = tmp_path / "n1.yaml"
    config.write_text(f"security: {{tls_ca: {pki.ca}, tls_cert: {cert}, tls_key: {other_key}, "
                      f"cluster_token_file: {pki.token}}}\n")
    result = cli("start", "--node-id", "n1", "--listen", "127.0.0.1:27999", "--data-dir", str(tmp_path / "d"),
                 "--config", str(config), timeout=60)
    last = [line for line in result.stderr.splitlines() if line.startswith("dpeer:")]
    assert result.returncode == 2 and last, result.stderr
    assert "in use" not in last[-1] and "key" in last[-1], f"misleading error: {last[-1]}"
