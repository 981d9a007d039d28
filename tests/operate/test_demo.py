"""The README's first command as a new user runs it: `dpeer demo` trains to the end, in the venv
scripts/setup made without system site packages, and its live screen shows what it promises."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from dpeer.consensus.ready import Role
from dpeer.launch.cluster import LocalCluster, free_port_block
from tests.support.daemons import cli_many, one_sentence

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DPEER_")}


def in_fresh_venv() -> bool:
    """True when this interpreter is a venv that does not see the system's site packages."""
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    return sys.prefix != sys.base_prefix and cfg.exists() and \
        "include-system-site-packages = false" in cfg.read_text()


def test_demo_runs_a_local_cluster_to_the_last_step(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dpeer.cli.main", "demo", "--nodes", "2", "--steps", "80", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=clean_env(),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "training finished: every replica holds step 80 with digest" in result.stdout
    assert "the job finished at step 80" in result.stdout
    for node in ("n1", "n2"):
        assert (tmp_path / node / "worker" / "final.pt").exists(), f"{node} did not finish its job"


@pytest.mark.skipif(not in_fresh_venv(), reason="scripts/test runs the suite in the venv scripts/setup makes; "
                                                 "this run is outside it")
def test_the_readme_demo_command_trains_in_a_venv_without_system_packages(tmp_path: Path) -> None:
    """README: `scripts/demo` (scripts/setup, then `dpeer demo`). scripts/test made this very venv
    the same way, so setup finds it ready; numpy, which the base Python here has, is absent."""
    assert subprocess.run([sys.executable, "-c", "import numpy"], capture_output=True).returncode != 0
    env = {**clean_env(), "DPEER_VENV": sys.prefix}
    result = subprocess.run([str(REPO / "scripts" / "demo"), "--steps", "200", "--dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "training finished: every replica holds step 200 with digest" in result.stdout


def run_in_pty(cmd: list[str], timeout: float) -> tuple[int, str]:
    """Run cmd on a 40x120 pseudo-terminal; its exit code and everything it drew."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env={**clean_env(), "TERM": "xterm"},
                            start_new_session=True)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(timeout=60), out.decode(errors="replace")


def test_the_live_screen_on_a_terminal_shows_a_row_per_node_and_the_events(tmp_path: Path) -> None:
    code, drawn = run_in_pty([sys.executable, "-m", "dpeer.cli.main", "demo", "--nodes", "2", "--steps", "400",
                              "--dir", str(tmp_path)], timeout=300)
    assert code == 0, drawn[-3000:]
    assert "\x1b[" in drawn, "a terminal gets a screen redrawn in place, not plain lines"
    text = ANSI.sub("", drawn)
    last = text[text.rfind("dpeer demo "):]
    head = last.splitlines()[0]
    assert re.search(r"leader n[12]\s+generation \d+\s+step 400/400\s+[\d.]+ steps/s", head), head
    assert re.search(r"loss \d+\.\d{4} [▁▂▃▄▅▆▇█]+", last), last[:500]
    assert re.search(r"NODE\s+STATE\s+ROLE\s+RANK\s+STEP\s+LOSS\s+RTT\s+DIGEST", last)
    roles = "|".join(r.value for r in Role)  # a follower that missed a heartbeat under load shows pre_candidate
    rows = {m.group(1): m for m in re.finditer(rf"^(n[12])\s+(finished)\s+({roles})\s+(\d)/2\s+400\s+"
                                               r"(\d+\.\d{4})\s+([\d.]+ms|-)\s+([0-9a-f]{12})\s*$", last, re.M)}
    assert set(rows) == {"n1", "n2"}, last[:1500]
    assert [r.group(3) for r in rows.values()].count("leader") == 1, "one leader row"
    assert rows["n1"].group(7) == rows["n2"].group(7)
    assert re.search(r"^\s+[\d.]+s\s+generation \d+ formed: n\d, n\d", last, re.M), "the events list"
    assert "the job finished at step 400" in last


def test_demo_refuses_flags_that_could_never_run_before_starting_anything(tmp_path: Path) -> None:
    """--steps 0 is not the default 20000; a --base-port whose last node would listen past 65535
    and a --dir that is a file are one sentence each, exit 2, with no daemon started."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = {"--nodes": ["--nodes", "0"], "--steps": ["--steps", "0"], "65533": ["--nodes", "2", "--base-port", "65534"],
             "is a file": ["--dir", str(a_file)]}
    results = cli_many([["demo", *flags, *([] if "--dir" in flags else ["--dir", str(tmp_path / "d")])]
                        for flags in cases.values()])
    for expected, result in zip(cases, results):
        assert result.returncode == 2, (result.args, result.returncode, result.stderr)
        assert expected in one_sentence(result.stderr), (result.args, result.stderr)
        assert result.stdout == "", result.stdout
    assert not (tmp_path / "d").exists(), "a refused demo must not start a cluster"


def test_demo_ends_with_the_daemons_error_when_one_cannot_start(tmp_path: Path) -> None:
    """Outside tester's finding: with n2's port taken the demo trained on n1 alone and then redrew
    "step 20/20 0.0 steps/s" for ever. It must end (exit 1), show n2's error from its log and stop n1."""
    base = free_port_block(4)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", base + 2))  # n2's gRPC port (nodes are 2 ports apart)
    squatter.listen()
    try:
        demo = subprocess.Popen(
            [sys.executable, "-m", "dpeer.cli.main", "demo", "--nodes", "2", "--steps", "20",
             "--base-port", str(base), "--dir", str(tmp_path / "demo")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(), stdin=subprocess.DEVNULL)
        try:
            stdout, stderr = demo.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            demo.send_signal(signal.SIGTERM)  # the demo stops its daemons on SIGTERM (not on SIGKILL)
            stdout, _ = demo.communicate(timeout=60)
            raise AssertionError(f"dpeer demo did not end in 180 s although n2 never started; its last lines: "
                                 f"{stdout[-600:]}") from None
    finally:
        squatter.close()
    assert demo.returncode == 1, (demo.returncode, stdout[-1500:], stderr)
    assert "n2's daemon exited while starting (exit code 4)" in stderr, stderr
    assert f"cannot listen on 127.0.0.1:{base + 2}" in stderr, "the tail of n2's log shows its error"
    assert "pick another --base-port" in stderr.strip().splitlines()[-1]
    with socket.socket() as probe:  # n1 was stopped: nothing listens on its port (SO_REUSEADDR: TIME_WAIT is fine)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", base))


def test_only_a_daemon_the_chaos_schedule_did_not_kill_ends_the_demo(tmp_path: Path) -> None:
    """A node the schedule killed and has not restarted yet is expected down; any other daemon
    that ended (at start, or after answering, or after its restart) ends the run with its log."""
    import time as clock

    from rich.console import Console

    from dpeer.cli.demo import Demo, DaemonExited

    cluster = LocalCluster(tmp_path, 2, base_port=free_port_block(2))
    for node in cluster.nodes:
        node.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        node.proc.wait(timeout=60)
    cluster.nodes[1].log_path.write_text("dpeer: cannot listen on 127.0.0.1:1: the address is in use\n")
    demo = Demo(cluster, 20, None, Console())
    now = clock.monotonic()
    demo.log.killed(now, "n1", 0)
    with pytest.raises(DaemonExited) as exited:
        demo._check_exits()
    assert exited.value.node.node_id == "n2" and "while starting (exit code 3)" in str(exited.value)
    assert "cannot listen" in exited.value.log_tail
    demo.log.killed(now, "n2", 0)
    demo._check_exits()  # both down by the schedule's hand: nothing to report
    demo.log.restarted(now, "n1")  # n1 restarted and ended again: reported, as one that had answered
    demo._answered.add("n1")
    with pytest.raises(DaemonExited, match="n1's daemon exited while the demo ran"):
        demo._check_exits()
