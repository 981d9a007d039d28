"""Secure by default: `dpeer start` off loopback refuses to run without mutual TLS and a cluster token,
`--insecure` starts it with a warning (in a network namespace of the test's own, so 0.0.0.0 is only
its loopback), and a certificate that names another node is refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpeer.launch.cluster import free_port_block
from tests.support.daemons import cli, one_sentence
from tests.support.pki import Pki


def test_an_exposed_address_without_security_exits_2_with_how_to_fix_it(tmp_path: Path, pki: Pki) -> None:
    port = free_port_block(1)
    token_only = tmp_path / "token-only.yaml"
    token_only.write_text(yaml.safe_dump({"security": {"cluster_token_file": str(pki.token)}}))
    runs = [cli("start", "--node-id", "a", "--listen", f"0.0.0.0:{port}", "--data-dir", str(tmp_path / "a")),
            cli("start", "--node-id", "a", "--listen", f"10.255.255.1:{port}", "--data-dir", str(tmp_path / "a"),
                "--config", str(pki.config("mtls-only", "node-n1", token=False))),
            cli("start", "--node-id", "a", "--listen", f"0.0.0.0:{port}", "--data-dir", str(tmp_path / "a"),
                "--config", str(token_only), "--insecure"),
            cli("start", "--node-id", "n2", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "a"),
                "--config", str(pki.config("n1-cert", "node-n1")))]
    for result in runs:
        assert result.returncode == 2, (result.args, result.returncode, result.stderr)
    first, mtls_only, token_in_clear, wrong_cert = (one_sentence(r.stderr) for r in runs)
    assert "not loopback" in first and "mutual TLS and a cluster token" in first
    assert "dpeer certs create-ca" in first and "--insecure" in first
    assert "needs a cluster token" in mtls_only
    assert "in clear" in token_in_clear
    assert "names node/n1, not node/n2" in wrong_cert and "dpeer certs create-node n2" in wrong_cert
    assert not (tmp_path / "a" / "store").exists(), "a refused start must not open the store"


INSECURE_RUN = r"""
set -u
ip link set lo up
"$PY" -m dpeer.cli.main start --node-id a --listen 0.0.0.0:$PORT --advertise 127.0.0.1:$PORT --data-dir "$DIR" \
    --insecure --metrics-listen 127.0.0.1:$MPORT >> "$DIR.log" 2>&1 &
daemon=$!
for _ in $(seq 1 300); do
  "$PY" -m dpeer.cli.main status --addr 127.0.0.1:$PORT --json > "$DIR.status" 2>/dev/null && break
  sleep 0.2
done
"$PY" -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$MPORT/metrics').read().decode())" > "$DIR.metrics"
kill -TERM $daemon
wait $daemon
"""


def test_insecure_starts_on_any_address_and_warns_every_start(tmp_path: Path) -> None:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode != 0:
        pytest.skip("cannot make a network namespace here (unshare -n)")
    port = free_port_block(2)
    d = tmp_path / "a"
    env = {"PY": sys.executable, "PORT": str(port), "MPORT": str(port + 1), "DIR": str(d), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    for _ in range(2):  # a warning at every start, the second on the node's old data dir
        done = subprocess.run(["unshare", "-n", "bash", "-c", INSECURE_RUN], env=env, capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, (done.stdout, done.stderr, Path(f"{d}.log").read_text())
        status = json.loads(Path(f"{d}.status").read_text())
        assert status["security"] == {"mode": "none", "insecure": True, "insecure_data_plane": False, "refused": 0}, \
            status["security"]
        assert 'dpeer_security_insecure{node="a"} 1.0' in Path(f"{d}.metrics").read_text()
    warnings = [json.loads(line) for line in Path(f"{d}.log").read_text().splitlines()
                if line.startswith("{") and "INSECURE" in line]
    assert len(warnings) == 2 and all(w["level"] == "warning" for w in warnings), warnings
    assert "on 0.0.0.0" in warnings[0]["msg"] and "anyone who reaches this port" in warnings[0]["msg"]


def test_a_key_that_does_not_match_its_certificate_is_named_before_anything_is_made(tmp_path: Path, pki: Pki) -> None:
    """Outside tester's finding: n2's key next to n1's certificate (a copy-paste slip) read "cannot
    listen on HOST:PORT: the address is in use", after the store was created. Now the node says the
    key does not go with the certificate (exit 2) and its data dir stays untouched; a client with
    the same slip is told so (exit 2), not that the node is unreachable (exit 3)."""
    cert, _ = pki.files("node-n1")
    _, other_key = pki.files("node-n2")
    config = tmp_path / "n1.yaml"
    config.write_text(yaml.safe_dump({"security": {"tls_ca": str(pki.ca), "tls_cert": str(cert),
                                                   "tls_key": str(other_key), "cluster_token_file": str(pki.token)}}))
    alice_cert, _ = pki.files("operator-alice")
    port = free_port_block(1)
    node, client = (cli("start", "--node-id", "n1", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d"),
                        "--config", str(config)),
                    cli("status", "--addr", f"127.0.0.1:{port}", "--tls-ca", str(pki.ca), "--tls-cert", str(alice_cert),
                        "--tls-key", str(other_key), "--token-file", str(pki.token)))
    line = one_sentence(node.stderr)
    assert node.returncode == 2, (node.returncode, node.stderr)
    assert f"security.tls_key {other_key} does not go with security.tls_cert {cert}" in line, line
    assert "public keys differ" in line and "in use" not in line
    assert not (tmp_path / "d").exists(), "a refused start must not create its data dir"
    line = one_sentence(client.stderr)
    assert client.returncode == 2 and f"--tls-key {other_key} does not go with --tls-cert {alice_cert}" in line, line
