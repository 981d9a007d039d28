"""One live process per node id, on real processes with the documented secure setup (issue 35,
finding 4, the review's two reproductions). A cloned SD-card image boots beside its original:
with a fresh data dir but the original's config (`advertise:` the original's address), or with
the whole data dir too (the same store uid). Either way the clone is refused with its sentence
and exits 2, the healthy original keeps its seat, its store and a leader, the leader never
replaces its identity, and the leader's fault tolerance ends full. The original of the second
test is itself a restart on its own disk at its own address: it is not refused."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

from tests.support.daemons import DPEER, WAIT, Daemon, Daemons, cli, formed, wait_status
from tests.support.pki import Pki

FULL = {"voters": 3, "live_voters": 3, "can_lose": 1, "unheld": []}


def start_clone(daemons: Daemons, pki: Pki, data_dir: Path, listen: str, advertise: str | None, join: str,
                log_path: Path) -> subprocess.Popen:
    """`dpeer start` as n3 from a cloned image: n3's certificate and config, its own data dir."""
    cmd = [*DPEER, "start", "--node-id", "n3", "--listen", listen, "--data-dir", str(data_dir),
           "--config", str(pki.config("n3", "node-n3")), "--join", join]
    if advertise is not None:
        cmd += ["--advertise", advertise]
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stopped_with(clone: subprocess.Popen, log_path: Path, sentence: str) -> None:
    """The clone exits 2 by itself, its last line the refusal's sentence."""
    try:
        code = clone.wait(timeout=WAIT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the clone still runs: {log_path.read_text()[-3000:]}") from None
    lines = log_path.read_text().splitlines()
    assert code == 2 and f"dpeer: {sentence}" in lines, (code, lines[-20:])


def original_keeps_its_seat(daemons: Daemons, pki: Pki, n3: Daemon, uid: str, n1: Daemon) -> None:
    """n3 runs under its store with a leader, commits through it, and the leader is back at full
    fault tolerance without ever having replaced n3's identity."""
    reader = pki.security("client-bob")
    assert n3.running, n3.tail(20)
    doc = wait_status(n3.addr, lambda d: d["uid"] == uid and d["leader"] is not None, "n3 with a leader",
                      security=reader)
    put = cli("kv", "put", "after-the-clone", "1", "--addr", n3.addr, "--config",
              str(pki.config("client-alice", "operator-alice")), "--timeout", "20")
    assert put.returncode == 0, put.stderr
    leader = next(d for d in daemons.nodes if d.node_id == doc["leader"] and d.running)
    wait_status(leader.addr, lambda d: d["fault_tolerance"] == FULL and d["strangers"] == [],
                "full fault tolerance on the leader", security=reader)
    for daemon in daemons.nodes:
        assert "came back on a new disk" not in daemon.log_path.read_text(), daemon.node_id
    assert n1.running


def three_boxes(daemons: Daemons, pki: Pki) -> tuple[Daemon, Daemon, str]:
    """A secured cluster of n1, n2 and n3, formed: n1, n3 and n3's store uid."""
    n1 = daemons.start("n1", config=pki.config("n1", "node-n1"))
    daemons.start("n2", config=pki.config("n2", "node-n2"), join=[n1.addr])
    n3 = daemons.start("n3", config=pki.config("n3", "node-n3"), join=[n1.addr])
    reader = pki.security("client-bob")
    formed(n1.addr, {"n1", "n2", "n3"}, security=reader)
    return n1, n3, wait_status(n3.addr, lambda d: d["uid"], "n3's uid", security=reader)["uid"]


def test_a_clone_advertising_the_originals_address_does_not_take_a_live_members_id(daemons: Daemons,
                                                                                     pki: Pki) -> None:
    """A fresh data dir: the join names n3's own address, so only who answers there tells the
    clone from a reinstall; n3 does."""
    n1, n3, uid = three_boxes(daemons, pki)
    log_path = daemons.root / "clone.log"
    clone = start_clone(daemons, pki, daemons.root / "clone", f"127.0.0.1:{daemons.port()}", n3.addr, n1.addr,
                        log_path)
    try:
        stopped_with(clone, log_path, f"node id n3 is held by a live member at {n3.addr} (store {uid[:8]}); give "
                     "this box another --node-id, or stop that one and wait until gossip holds it dead")
        original_keeps_its_seat(daemons, pki, n3, uid, n1)
    finally:
        if clone.poll() is None:
            clone.kill()
            clone.wait()


def test_a_copy_of_a_whole_disk_beside_its_original_is_refused(daemons: Daemons, pki: Pki) -> None:
    """n3 killed, its data dir copied, n3 restarted on its disk at its address (a restart: not
    refused), then the copy started at another address: same node id, same store uid."""
    n1, n3, uid = three_boxes(daemons, pki)
    reader = pki.security("client-bob")
    daemons.signal(n3, signal.SIGKILL)
    n3.proc.wait(timeout=30)
    shutil.copytree(n3.data_dir, daemons.root / "image")  # the SD card, cloned
    original = daemons.start("n3", config=pki.config("n3", "node-n3"), join=[n1.addr], listen=n3.addr)
    boot = wait_status(original.addr, lambda d: d["leader"] is not None, "the restarted n3 with a leader",
                       security=reader)["boot"]
    log_path = daemons.root / "copy.log"
    copy = start_clone(daemons, pki, daemons.root / "image", f"127.0.0.1:{daemons.port()}", None, n1.addr,
                       log_path)
    try:
        stopped_with(copy, log_path, f"node id n3 and its store {uid[:8]} are held by another live process at "
                     f"{n3.addr} (boot {boot[:8]}, started before this one); this box runs a copy of its disk: give "
                     "it a fresh data dir and another --node-id")
        original_keeps_its_seat(daemons, pki, original, uid, n1)
        assert wait_status(original.addr, lambda d: True, "n3's status", security=reader)["boot"] == boot
    finally:
        if copy.poll() is None:
            copy.kill()
            copy.wait()
