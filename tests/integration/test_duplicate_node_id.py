"""One live holder per node id (issue 35, finding 4), on real processes. A second daemon started
under a live member's node id on a fresh data dir (a cloned disk image) is refused with one
sentence and exits 2; the original keeps its seat and commits, and the leader's fault tolerance
stays full. A truly dead member's id is still replaced: killed for good, its data dir wiped,
restarted, it rejoins; the fault-tolerance figure drops while it is dead and recovers after."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal

from dpeer.launch.cluster import LocalCluster, LocalNode, free_port_block
from tests.support.cluster import TIMEOUT, formed, run
from tests.support.daemons import cli

FULL = {"voters": 3, "live_voters": 3, "can_lose": 1, "unheld": []}


def leader_doc(docs: dict) -> dict | None:
    """The status of the node that leads, as every live node names it."""
    leaders = {d["leader"] for d in docs.values() if d is not None}
    if len(leaders) != 1 or None in leaders:
        return None
    return docs.get(leaders.pop())


async def exit_code(node: LocalNode, timeout: float) -> int:
    """Wait (without blocking the loop) for the node's process to end on its own; its exit code."""
    deadline = asyncio.get_running_loop().time() + timeout
    while node.proc is not None and node.proc.poll() is None:
        assert asyncio.get_running_loop().time() < deadline, f"{node.node_id} still runs after {timeout:.0f}s"
        await asyncio.sleep(0.2)
    assert node.proc is not None
    return node.proc.returncode


def test_a_second_box_under_a_live_id_is_refused_and_a_dead_ones_id_is_still_replaced(make_cluster) -> None:
    cluster: LocalCluster = make_cluster(3)
    cluster.start_all()
    n1, n2, n3 = cluster.nodes
    clone = LocalNode("n1", free_port_block(1), cluster.root / "n1-clone", cluster.root / "n1-clone.log")

    async def scenario() -> None:
        docs = await formed(cluster, 3)
        uid = docs["n1"]["uid"]
        cluster.start(clone, join=[n2.addr, n3.addr])
        assert await exit_code(clone, TIMEOUT) == 2, cluster.tail(clone)
        sentence = (f"dpeer: node id n1 is held by a live member at {n1.addr} (store {uid[:8]}); give this box "
                    "another --node-id, or stop that one and wait until gossip holds it dead")
        assert sentence in clone.log_path.read_text().splitlines(), cluster.tail(clone)

        put = cli("kv", "put", "after-the-clone", "1", "--addr", n1.addr, "--timeout", "20")
        assert put.returncode == 0, put.stderr
        docs = await cluster.wait_for(
            lambda d: (lead := leader_doc(d)) is not None and lead["fault_tolerance"] == FULL
            and d["n1"]["uid"] == uid and d["n1"]["leader"] is not None and lead["strangers"] == [],
            TIMEOUT, "the original n1 in its seat and full fault tolerance")
        assert sorted(leader_doc(docs)["voters"]) == ["n1", "n2", "n3"]
        for node in cluster.nodes:
            assert "came back on a new disk" not in node.log_path.read_text(), node.node_id

        cluster.kill(n1, signal.SIGKILL)
        docs = await cluster.wait_for(
            lambda d: (lead := leader_doc(d)) is not None
            and lead["fault_tolerance"] == {"voters": 3, "live_voters": 2, "can_lose": 0, "unheld": ["n1"]},
            TIMEOUT, "the leader saying it can lose no more voters while n1 is dead")
        leader = cluster.node(leader_doc(docs)["node_id"])
        assert "survives 0 more voter failure(s)" in leader.log_path.read_text()
        shutil.rmtree(n1.data_dir)
        cluster.start(n1)
        docs = await formed(cluster, 3)  # n1 removed under its old store, added back as a learner, promoted
        assert docs["n1"]["uid"] != uid
        await cluster.wait_for(lambda d: (lead := leader_doc(d)) is not None and lead["fault_tolerance"] == FULL,
                               TIMEOUT, "full fault tolerance again")
        got = cli("kv", "get", "after-the-clone", "--addr", n1.addr, "--json")
        assert got.returncode == 0 and json.loads(got.stdout)["value"] == "1", got

    try:
        run(scenario())
    finally:
        if clone.running:
            cluster.kill(clone, signal.SIGKILL)
