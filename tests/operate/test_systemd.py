"""systemd integration: the notify protocol over a fake NOTIFY_SOCKET, SIGTERM, and the unit file."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.support.daemons import WAIT, formed, wait_status, wait_until

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "scripts" / "dpeer.service"


class FakeSystemd:
    """A Unix datagram socket standing in for systemd's NOTIFY_SOCKET; records (time, fields)."""

    def __init__(self) -> None:
        # sun_path is at most 107 bytes: pytest's tmp_path can be longer, so use a short dir.
        self.dir = tempfile.mkdtemp(prefix="dpn-", dir="/tmp")
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            with self._lock:
                self.messages.append((time.monotonic(), fields))

    def times(self, key: str) -> list[float]:
        """When each datagram carrying KEY=1 arrived."""
        with self._lock:
            return [t for t, f in self.messages if f.get(key) == "1"]

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=5)
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def fake_systemd():
    made: list[FakeSystemd] = []

    def make() -> FakeSystemd:
        made.append(FakeSystemd())
        return made[-1]

    yield make
    for fake in made:
        fake.close()


def test_ready_after_join_watchdog_and_sigterm_leaves(daemons, fake_systemd) -> None:
    sd1, sd2 = fake_systemd(), fake_systemd()
    seed_port = daemons.port()
    seed = f"127.0.0.1:{seed_port}"
    # n2 starts first, joining through a seed that is not up yet: it must not claim READY.
    n2 = daemons.start("n2", join=[seed], env={"NOTIFY_SOCKET": sd2.path, "WATCHDOG_USEC": "2000000"})
    wait_status(n2.addr, lambda d: d.get("joined") is False, "n2 serving, not yet joined", timeout=WAIT)
    wait_until(lambda: len(sd2.times("WATCHDOG")) >= 2, WAIT, "n2 sends WATCHDOG=1 while it waits to join")
    assert sd2.times("READY") == [], "READY=1 before the node joined a cluster"

    n1 = daemons.start("n1", listen=seed, env={"NOTIFY_SOCKET": sd1.path})  # no WATCHDOG_USEC
    formed(n1.addr, {"n1", "n2"})
    wait_until(lambda: sd1.times("READY") and sd2.times("READY"), WAIT, "READY=1 from both nodes")
    assert len(sd2.times("READY")) == 1 and len(sd1.times("READY")) == 1
    doc = wait_status(n2.addr, lambda d: d.get("joined") is True, "n2 joined")
    assert any(m["node_id"] == "n2" and m.get("committed") == "active" for m in doc["members"])

    # The watchdog: WATCHDOG_USEC=2 s asks for a ping well within 2 s; the daemon pings every ~0.5 s.
    start = time.monotonic()
    wait_until(lambda: len([t for t in sd2.times("WATCHDOG") if t > start]) >= 4, 20, "four more WATCHDOG=1 from n2")
    beats = sd2.times("WATCHDOG")
    gaps = [b - a for a, b in zip(beats, beats[1:])]
    assert max(gaps) < 2.0, f"watchdog gaps {gaps} exceed WATCHDOG_USEC"
    assert sd1.times("WATCHDOG") == [], "WATCHDOG=1 sent although systemd asked for no watchdog"

    # SIGTERM: STOPPING=1, a committed member_left seen by n1, exit 0.
    daemons.signal(n2, signal.SIGTERM)
    assert n2.wait_exit(WAIT) == 0, n2.tail()
    assert sd2.times("STOPPING"), "no STOPPING=1 on SIGTERM"
    wait_status(n1.addr, lambda d: any(m["node_id"] == "n2" and m.get("committed") == "left"
                                       and m["state"] == "left" for m in d["members"]),
                "n2's leave committed and gossiped, as seen from n1")
    assert any(line.get("msg", "").startswith("received SIGTERM") for line in n2.log_lines())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_unit_file_verifies_clean(tmp_path: Path) -> None:
    dpeer = shutil.which("dpeer")
    if dpeer is None:
        pytest.skip("the dpeer command is not on PATH (pip install -e . installs it)")
    text = UNIT.read_text()
    assert "/usr/local/bin/dpeer" in text
    unit = tmp_path / "dpeer.service"
    unit.write_text(text.replace("/usr/local/bin/dpeer", dpeer))  # what scripts/install.sh does
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120)
    complaints = [line for line in (result.stdout + result.stderr).splitlines()
                  if "dpeer.service" in line or str(tmp_path) in line]
    assert result.returncode == 0 and not complaints, result.stdout + result.stderr
    settings = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["Type"] == "notify" and settings["KillSignal"] == "SIGTERM"
    assert int(settings["WatchdogSec"]) >= 2 and settings["Restart"] == "on-failure"
    assert "2" in settings.get("RestartPreventExitStatus", "").split(), "a bad config (exit 2) must not restart-loop"
    install = (REPO / "scripts" / "install.sh").read_text()
    assert "/usr/local/bin/dpeer" in install and "config check /etc/dpeer/dpeer.yaml" in install


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_unit_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The verify test above can fail: a typo in the unit is reported."""
    dpeer = shutil.which("dpeer") or "/bin/true"
    unit = tmp_path / "dpeer.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/dpeer", dpeer).replace("WatchdogSec=30", "WatchdogSec=x"))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120)
    assert "WatchdogSec" in result.stderr or "sec value" in result.stderr, result.stderr


def test_install_script_names_a_missing_prerequisite(tmp_path: Path) -> None:
    """install.sh checks what it needs before touching the system: here systemctl is absent."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "id", "dirname", "cat", "env"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    result = subprocess.run([str(bin_dir / "bash"), str(REPO / "scripts" / "install.sh"), "n1", "10.0.0.1:7100"],
                            capture_output=True, text=True, timeout=60, env={"PATH": str(bin_dir)})
    if "run it as root" in result.stderr:
        pytest.skip("not root here: install.sh stops at its first check")
    assert result.returncode == 1 and "systemctl is missing" in result.stderr, result.stderr


def test_the_unit_reads_an_environment_file_names_installed_docs_and_install_writes_the_job() -> None:
    text = UNIT.read_text()
    settings = [line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")]
    assert ["EnvironmentFile", "-/etc/dpeer/dpeer.env"] in settings
    assert "ExecReload" not in dict(settings), "SIGHUP means nothing to the daemon: no ExecReload"
    docs = dict(settings)["Documentation"].split()
    install = (REPO / "scripts" / "install.sh").read_text()
    assert 'install -m 0644 "$here/README.md" "$here"/docs/*.md /usr/share/doc/dpeer/' in install
    for url in docs:
        name = url.removeprefix("file:///usr/share/doc/dpeer/")
        assert (REPO / name).is_file() or (REPO / "docs" / name).is_file(), f"{url} names a file nothing installs"
    assert 'echo "job: \\"$job\\""' in install and "/etc/dpeer/dpeer.env" in install
    for kept in ("create-ca", "create-node", "tls_ca:", "cluster_token_file:", "umask 077"):
        assert kept in install, f"install.sh no longer writes its security ({kept})"
    missing_value = subprocess.run(["bash", str(REPO / "scripts" / "install.sh"), "--job"], capture_output=True,
                                   text=True, timeout=30)
    assert missing_value.returncode == 2 and "[--job demo|MODULE:FUNCTION|PATH.py]" in missing_value.stderr
