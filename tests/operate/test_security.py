"""Security as an operator configures it: mutual TLS, the cluster token, and binding only the listen address."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import yaml

from dpeer.transport.options import Security
from tests.support.daemons import WAIT, cli, cli_many, formed, one_sentence, status_of, wait_until
from tests.support.pki import make_pki


def config(d: Path, name: str, cert: tuple[Path, Path] | None, ca: Path | None, token: str | None) -> Path:
    """A YAML config with the given TLS identity (certificate, key) and CA, and a token file holding token."""
    security: dict[str, str] = {}
    if cert is not None and ca is not None:
        security.update(tls_cert=str(cert[0]), tls_key=str(cert[1]), tls_ca=str(ca))
    if token is not None:
        (d / f"{name}.token").write_text(token + "\n")
        (d / f"{name}.token").chmod(0o600)  # dpeer start refuses a token others can read
        security["cluster_token_file"] = str(d / f"{name}.token")
    path = d / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"security": security}))
    return path


def security_of(path: Path) -> Security:
    from dpeer.daemon import config as cfg
    s = cfg.load(path, environ={}).security
    return Security.from_files(s.tls_cert, s.tls_key, s.tls_ca, s.cluster_token_file)


def test_mutual_tls_and_cluster_token(daemons, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    d = pki.root
    token = pki.token.read_text().strip()
    c1, c2 = config(d, "n1", pki.files("node-n1"), pki.ca, token), config(d, "n2", pki.files("node-n2"), pki.ca, token)
    op = pki.files("operator-alice")
    operator = config(d, "op", op, pki.ca, token)
    n1 = daemons.start("n1", config=c1)
    n2 = daemons.start("n2", join=[n1.addr], config=c2)
    good = security_of(operator)
    formed(n1.addr, {"n1", "n2"}, security=good)
    formed(n2.addr, {"n1", "n2"}, security=good)

    ok, put = cli_many([["status", "--addr", n2.addr, "--json", "--config", str(operator)],
                        ["kv", "put", "secure", "yes", "--addr", n2.addr, "--config", str(operator)]])
    assert ok.returncode == 0 and '"node_id": "n2"' in ok.stdout, ok.stderr
    assert put.returncode == 0, put.stderr

    # Refused: plaintext; a certificate from another CA; the right certificate without the token
    # or with a wrong one.
    no_token = config(d, "notoken", op, pki.ca, None)
    wrong_token = config(d, "wrongtoken", op, pki.ca, "not-the-token")
    rogue = config(d, "rogue", pki.files("node-n1", other_ca=True), pki.root / "other" / "ca.pem", token)
    refusals = cli_many([
        ["status", "--addr", n1.addr, "--timeout", "3"],
        ["status", "--addr", n1.addr, "--timeout", "3", "--config", str(rogue)],
        ["kv", "put", "x", "y", "--addr", n1.addr, "--timeout", "3", "--config", str(rogue)],
        ["status", "--addr", n1.addr, "--timeout", "3", "--config", str(no_token)],
        ["kv", "get", "secure", "--addr", n1.addr, "--timeout", "3", "--config", str(wrong_token)],
    ])
    plaintext = refusals[0]  # the node closes a plaintext connection: indistinguishable from a hang-up
    assert plaintext.returncode == 3, (plaintext.returncode, plaintext.stderr)
    assert "TLS" in one_sentence(plaintext.stderr)
    for result in refusals[1:3]:  # a certificate from another CA: the handshake fails, a refusal
        assert result.returncode == 1, (result.args, result.returncode, result.stderr)
        line = one_sentence(result.stderr)
        assert "refused" in line and "TLS handshake" in line, line
        assert result.stdout == ""
    for result in refusals[3:]:  # TLS is fine, the token is not: a refusal, not unreachability
        assert result.returncode == 1, (result.args, result.returncode, result.stderr)
        line = one_sentence(result.stderr)
        assert "refused" in line and "token" in line, line
    assert asyncio.run(status_of(n1.addr, security_of(rogue))) is None

    # The server logs the token refusals as JSON lines.
    def refusal_logged() -> list:
        return [r for r in n1.log_lines() if r.get("level") == "warning" and "cluster token" in r.get("msg", "")]
    logged = wait_until(refusal_logged, 10, "n1 to log the token refusals")
    assert all(r.get("node") == "n1" and "term" in r for r in logged), logged
    # Failed TLS handshakes must not add gRPC's own non-JSON lines to the log.
    not_json = [line for line in n1.log_path.read_text().splitlines() if line.strip() and not line.startswith("{")]
    assert not not_json, not_json[:5]

    # A peer with a good certificate but no token cannot join.
    seen = len(refusal_logged())
    n3 = daemons.start("n3", join=[n1.addr], config=config(d, "n3", pki.files("node-n3"), pki.ca, None))
    wait_until(lambda: len(refusal_logged()) > seen and any("cluster token" in r.get("msg", "") for r in n3.log_lines()),
               WAIT, "n3 to try joining and n1 to refuse it")
    doc = asyncio.run(status_of(n1.addr, good))
    assert doc is not None and "n3" not in {m["node_id"] for m in doc["members"] if m.get("committed")}, doc
    assert cli("kv", "get", "secure", "--addr", n1.addr, "--config", str(operator)).returncode == 0


def test_token_only_cluster_refuses_tokenless_clients(daemons, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("only-the-cluster-knows\n")
    token.chmod(0o600)  # dpeer start refuses a token others can read
    conf = tmp_path / "dpeer.yaml"
    conf.write_text(yaml.safe_dump({"security": {"cluster_token_file": str(token)}}))
    n1 = daemons.start("n1", config=conf)
    formed(n1.addr, {"n1"}, security=Security(token="only-the-cluster-knows"))
    with_token, without = cli_many([["kv", "get", "k", "--addr", n1.addr, "--config", str(conf)],
                                    ["status", "--addr", n1.addr]])
    assert with_token.returncode == 1 and "not set" in with_token.stderr  # answered: the key is absent
    assert without.returncode == 1, without
    assert "refused" in one_sentence(without.stderr)
    wait_until(lambda: [r for r in n1.log_lines() if "cluster token" in r.get("msg", "")], 10, "a logged refusal")


def test_binds_only_the_configured_address(daemons) -> None:
    n1 = daemons.start("n1")
    formed(n1.addr, {"n1"})
    port = int(n1.addr.rsplit(":", 1)[1])
    with socket.socket() as probe:
        probe.settimeout(2)
        assert probe.connect_ex(("127.0.0.1", port)) == 0
    for other in ("127.0.0.2", "127.1.2.3"):
        with socket.socket() as probe:
            probe.settimeout(2)
            assert probe.connect_ex((other, port)) != 0, f"the node answers on {other}:{port}"
    result = cli("status", "--addr", f"127.0.0.2:{port}", "--timeout", "2")
    assert result.returncode == 3
