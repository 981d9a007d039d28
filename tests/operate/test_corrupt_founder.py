"""A founding box whose store is found corrupt at start (a torn or bit-flipped data.mdb, as on an
SD card) has it moved aside. Restarted with its usual command line, no --join (a systemd
install's first box has none), it must not found a second one-node cluster beside the real one
(an outside tester saw it lead one and commit writes the cluster never saw): it refuses to start,
exit 2, saying to rejoin with --join; so started, it rejoins and resyncs what it lost."""

from __future__ import annotations

import asyncio
import signal

from tests.support.daemons import WAIT, cli, formed, status_of, wait_until


def test_a_founder_whose_store_is_corrupt_refuses_to_found_again_and_rejoins_with_join(daemons) -> None:
    n1 = daemons.start("n1")
    n2 = daemons.start("n2", join=[n1.addr])
    daemons.start("n3", join=[n1.addr])
    formed(n1.addr, {"n1", "n2", "n3"})
    put = cli("kv", "put", "canary", "yes", "--addr", n2.addr)
    assert put.returncode == 0, put.stderr
    daemons.signal(n1, signal.SIGKILL)
    n1.proc.wait(timeout=30)
    data = n1.data_dir / "store" / "data.mdb"
    with open(data, "r+b") as f:  # a torn file: its meta page names a longer one
        f.truncate(data.stat().st_size // 2)

    for attempt in (1, 2):  # the second start finds an empty store and only the aside copy: refused too
        again = daemons.start("n1", listen=n1.addr)  # the same command line as before: no --join
        assert again.proc.wait(timeout=WAIT) == 2, f"start {attempt} did not refuse"
        said = again.log_path.read_text()
        assert "moved aside" in said and "--join" in said and "split" in said, said[-2000:]
    assert list(n1.data_dir.glob("store.corrupt-*")), "the corrupt store is kept, never deleted"

    back = daemons.start("n1", listen=n1.addr, join=[n2.addr])

    def rejoined() -> dict | None:
        doc = asyncio.run(status_of(back.addr))
        ok = doc is not None and doc["leader"] is not None and bool(set(doc["voters"]) & {"n2", "n3"}) \
            and "n1" in doc["voters"] + doc["learners"]
        return doc if ok else None
    wait_until(rejoined, 2 * WAIT, "n1 back in the cluster under n2 or n3")
    got = cli("kv", "get", "canary", "--addr", back.addr, "--json")
    assert got.returncode == 0 and '"yes"' in got.stdout, got.stdout + got.stderr
