"""Files only their owner reads (issue 35, finding 5): whoever starts the daemon, its data dir is
0700 and what it and its worker write there 0600 (the store holds each generation's secret); an
existing data dir open to others is made 0700 and logged, nothing in it lost; `dpeer certs` makes
its directory 0700, keys and token 0600; a key or token others can read is refused by `dpeer
start` and `dpeer config check`, as ssh refuses such a key."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from dpeer.security import certs
from tests.support.daemons import WAIT, Daemons, cli, cli_many, one_sentence, wait_status
from tests.support.pki import Pki, make_pki

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def modes_under(root: Path) -> dict[str, int]:
    """The mode of every file, directory and socket under root, by relative path."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            found[str(path.relative_to(root))] = mode(path)
    return found


def as_nobody(*command: str) -> subprocess.CompletedProcess:
    """Run command as user nobody (the outsider of the report)."""
    def drop() -> None:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    return subprocess.run(command, preexec_fn=drop, capture_output=True, text=True, timeout=60, cwd="/")


def test_a_daemon_with_a_job_writes_only_owner_readable_files_and_closes_an_open_data_dir(
        daemons: Daemons, tmp_path: Path) -> None:
    data_dir = tmp_path / "n1"
    data_dir.mkdir()
    os.chmod(data_dir, 0o755)  # made by hand as README once showed, under the usual umask 022
    (data_dir / "notes.txt").write_text("mine\n")
    conf = tmp_path / "dpeer.yaml"
    conf.write_text(yaml.safe_dump({"job": "demo", "training": {"steps": 40, "checkpoint_every": 10}}))
    n1 = daemons.start("n1", config=conf)
    wait_status(n1.addr, lambda d: (d.get("job") or {}).get("state") == "finished", "the demo job finished",
                timeout=3 * WAIT)

    found = modes_under(data_dir)
    assert mode(data_dir) == 0o700
    assert (data_dir / "notes.txt").read_text() == "mine\n", "nothing in the data dir is touched"
    expected = ["store/data.mdb", "store/lock.mdb", "worker/ledger.jsonl", "worker/reports/n1.jsonl",
                "worker/final.pt", "worker/doorbell"]
    assert all(name in found for name in expected), sorted(found)
    assert any(name.startswith("checkpoints/") and name.endswith(".bin") for name in found), sorted(found)
    views = [name for name in found if name.startswith("worker/views/view-")]
    assert views, sorted(found)
    opened = {name: f"{m:04o}" for name, m in found.items() if m & 0o077 and name != "notes.txt"}
    assert not opened, f"readable by others: {opened}"
    assert found["store/data.mdb"] == found["worker/ledger.jsonl"] == found[views[0]] == 0o600
    assert found["worker/doorbell"] == 0o600 and found["store"] == found["worker"] == 0o700

    said = [line for line in n1.log_lines() if "open to other users" in str(line.get("msg"))]
    assert len(said) == 1 and said[0]["level"] == "warning" and "made it 0700" in said[0]["msg"], said
    assert said[0]["node"] == "n1"

    if os.geteuid() == 0:  # the outsider of the report cannot read the store's secrets any more
        out = as_nobody("head", "-c", "1", str(data_dir / "store" / "data.mdb"))
        assert out.returncode != 0 and "Permission denied" in out.stderr, out


def test_dpeer_certs_makes_its_directory_0700_and_keys_and_token_0600(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    made = cli("certs", "create-ca", "--dir", str(pki))
    assert made.returncode == 0, made.stderr
    node, client = cli_many([["certs", "create-node", "n1", "--dir", str(pki)],
                             ["certs", "create-client", "alice", "--operator", "--dir", str(pki / "alice"),
                              "--ca-dir", str(pki)]])
    assert node.returncode == 0 and client.returncode == 0, (node.stderr, client.stderr)
    assert mode(pki) == mode(pki / "alice") == 0o700
    for secret in ("ca.key", "cluster.token", "node-n1.key", "alice/operator-alice.key"):
        assert mode(pki / secret) == 0o600, secret
    for cert in ("ca.pem", "node-n1.pem", "alice/operator-alice.pem"):
        assert mode(pki / cert) == 0o644, cert


def test_an_existing_certs_directory_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "certs"
    shared.mkdir()
    os.chmod(shared, 0o750)  # install.sh's /etc/dpeer/certs: root and the dpeer group
    certs.create_ca(shared)
    assert mode(shared) == 0o750 and mode(shared / certs.CA_KEY) == 0o600


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.mark.parametrize("secret", ["tls_key", "cluster_token_file"])
def test_a_key_or_token_others_can_read_is_refused_by_start_and_config_check(
        tmp_path: Path, pki: Pki, secret: str) -> None:
    conf = pki.config("n1", "node-n1")
    path = Path(yaml.safe_load(conf.read_text())["security"][secret])
    os.chmod(path, 0o644)
    start, check, check_json = cli_many([
        ["start", "--node-id", "n1", "--listen", "127.0.0.1:7109", "--data-dir", str(tmp_path / "d"),
         "--config", str(conf)],
        ["config", "check", str(conf)], ["config", "check", str(conf), "--json"]])
    expected = f"security.{secret} {path} is mode 0644, readable by others than its owner; run `chmod 600 {path}`"
    for result in (start, check):
        assert result.returncode == 2, (result.args, result.returncode, result.stderr)
        assert expected in one_sentence(result.stderr), result.stderr
    assert check_json.returncode == 2 and expected in check_json.stdout, check_json
    assert not (tmp_path / "d").exists(), "a refused start makes no data dir"
    os.chmod(path, 0o600)
    assert cli("config", "check", str(conf)).returncode == 0
