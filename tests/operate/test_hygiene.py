"""Process and port hygiene as a user meets it: nothing outlives what started it, ports typed in
a row do not collide, and `dpeer leave` works on every node in turn."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import yaml

from tests.support.daemons import DPEER, WAIT, Daemons, cli, wait_status, wait_until

REPO = str(Path(__file__).resolve().parents[2])


def alive(pid: int) -> bool:
    """True while pid runs (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


def pids_under(root: Path) -> set[int]:
    """Processes whose command line names a path under root (the demo's daemons and workers)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if str(root).encode() in cmdline:
                found.add(int(entry))
    return found


def test_a_worker_never_outlives_its_daemon(daemons: Daemons, tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    conf = tmp_path / "dpeer.yaml"
    conf.write_text(yaml.safe_dump({"job": "tests.operate.jobs:pid_file_job",
                                    "training": {"steps": 100000, "options": {"pid_file": str(pid_file)}}}))
    node = daemons.start("n1", config=conf, env={"PYTHONPATH": REPO})
    wait_status(node.addr, lambda d: (d.get("train") or {}).get("step", 0) > 0, "the worker trains", timeout=2 * WAIT)
    worker = int(pid_file.read_text())
    assert alive(worker)
    doc = wait_status(node.addr, lambda d: d["worker"].get("spare_pid"), "the warm spare", timeout=2 * WAIT)
    spare = doc["worker"]["spare_pid"]
    os.kill(node.proc.pid, signal.SIGKILL)  # the daemon only, not its process group
    node.proc.wait(timeout=30)
    wait_until(lambda: not alive(worker), 30, "the worker to exit after its daemon died")
    wait_until(lambda: not alive(spare), 30, "the spare worker to exit after its daemon died")


def test_three_daemons_on_consecutive_ports_train(daemons: Daemons, tmp_path: Path) -> None:
    conf = tmp_path / "dpeer.yaml"
    conf.write_text(yaml.safe_dump({"job": "demo", "training": {"steps": 100000, "checkpoint_every": 0}}))
    base = daemons.port()
    ports = [base, daemons.port(), daemons.port()]
    assert ports == [base, base + 1, base + 2]
    first = daemons.start("n1", config=conf, listen=f"127.0.0.1:{ports[0]}")
    others = [daemons.start(f"n{i}", join=[first.addr], config=conf, listen=f"127.0.0.1:{p}")
              for i, p in ((2, ports[1]), (3, ports[2]))]
    for node in [first, *others]:
        doc = wait_status(node.addr, lambda d: (d.get("group") or {}).get("world_size") == 3
                          and (d.get("train") or {}).get("step", 0) >= 20,
                          f"{node.node_id} training in a group of 3", timeout=3 * WAIT)
        assert doc["worker"]["store_port"] not in ports


def test_dpeer_leave_on_each_node_of_three_in_turn_exits_0(daemons: Daemons) -> None:
    first = daemons.start("n1")
    nodes = [first, daemons.start("n2", join=[first.addr]), daemons.start("n3", join=[first.addr])]
    wait_status(first.addr, lambda d: len(d["voters"]) == 3, "three voters")
    for i, node in enumerate(nodes):
        result = cli("leave", "--addr", node.addr, timeout=90)
        assert result.returncode == 0, (node.node_id, result.stdout, result.stderr)
        assert node.wait_exit() == 0
        for rest in nodes[i + 1:]:
            wait_status(rest.addr, lambda d, gone=node.node_id: gone not in d["voters"] and d["leader"] is not None,
                        f"{node.node_id} out of the voters and a leader among the rest")


def test_demo_leaves_nothing_running_after_sighup(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPEER_")}
    demo = subprocess.Popen([*DPEER, "demo", "--nodes", "2", "--steps", "100000", "--dir", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 3 * WAIT
        assert demo.stdout is not None
        for line in demo.stdout:
            if re.search(r"step [1-9]\d*/", line) or time.monotonic() > deadline:
                break
        started = pids_under(root)
        assert len(started) >= 4, f"expected 2 daemons and 2 workers, found {started}"
        demo.send_signal(signal.SIGHUP)
        assert demo.wait(timeout=60) == 128 + signal.SIGHUP
        wait_until(lambda: not any(alive(p) for p in started), 30, "every daemon and worker of the demo gone")
    finally:
        for pid in started | ({demo.pid} if demo.poll() is None else set()):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        demo.wait(timeout=30)


def test_a_command_sent_to_a_follower_just_after_the_leader_left_still_commits(daemons: Daemons) -> None:
    first = daemons.start("n1")
    nodes = [first, daemons.start("n2", join=[first.addr]), daemons.start("n3", join=[first.addr])]
    wait_status(first.addr, lambda d: len(d["voters"]) == 3 and d["leader"] == "n1", "three voters under n1")
    assert cli("leave", "--addr", first.addr, timeout=90).returncode == 0
    put = cli("kv", "put", "after", "leader-left", "--addr", nodes[1].addr, timeout=90)
    assert put.returncode == 0, put.stderr
    got = cli("kv", "get", "after", "--addr", nodes[2].addr, timeout=90)
    assert got.returncode == 0 and got.stdout.strip() == "leader-left", got
