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

from dpeer.launch.cluster import free_port_block
from tests.support.daemons import WAIT, Daemon, Daemons, cli, run, wait_until

FULL = {"voters": 3, "live_voters": 3, "can_lose": 1, "unheld": []}


def leader_doc(docs: dict) -> dict | None:
    """The status of the node that leads, as every live node names it."""
    leaders = {d["leader"] for d in docs.values() if d is not None}
    if len(leaders) != 1 or None in leaders:
        return None
    return docs.get(leaders.pop())


async def exit_code(node: Daemon, timeout: float) -> int:
    """Wait (without blocking the loop) for the node's process to end on its own; its exit code."""
    deadline = asyncio.get_running_loop().time() + timeout
    while node.proc is not None and node.proc.poll() is None:
        assert asyncio.get_running_loop().time() < deadline, f"{node.node_id} still runs after {timeout:.0f}s"
        await asyncio.sleep(0.2)
    assert node.proc is not None
    return node.proc.returncode


def test_a_second_box_under_a_live_id_is_refused_and_a_dead_ones_id_is_still_replaced(make_cluster) -> None:
    cluster: Daemons = make_cluster(3)
    cluster.start_all()
    clones: list[Daemon] = []

    async def scenario() -> None:
        docs = await cluster.formed(3)
        # the clone takes a follower's id: the leader tells its holder from the clone by what it hears
        victim = next(n for n in cluster.nodes if n.node_id != docs[n.node_id]["leader"])
        others = [n for n in cluster.nodes if n is not victim]
        uid = docs[victim.node_id]["uid"]
        port = free_port_block(1, start=max(n.port for n in cluster.nodes) + 2)  # past the cluster's block
        clone = Daemon(victim.node_id, port, cluster.root / "clone", cluster.root / "clone.log")
        clones.append(clone)
        cluster.start(clone, join=[n.addr for n in others])
        assert await exit_code(clone, WAIT) == 2, cluster.tail(clone)
        sentence = (f"dpeer: node id {victim.node_id} is held by a live member at {victim.addr} (store {uid[:8]}); "
                    "give this box another --node-id, or stop that one and wait until gossip holds it dead")
        assert sentence in clone.log_path.read_text().splitlines(), cluster.tail(clone)

        put = cli("kv", "put", "after-the-clone", "1", "--addr", victim.addr, "--timeout", "20")
        assert put.returncode == 0, put.stderr
        docs = await cluster.wait_for(
            lambda d: (lead := leader_doc(d)) is not None and lead["fault_tolerance"] == FULL
            and d[victim.node_id]["uid"] == uid and d[victim.node_id]["leader"] is not None
            and lead["strangers"] == [], WAIT, f"the original {victim.node_id} in its seat, full fault tolerance")
        assert sorted(leader_doc(docs)["voters"]) == ["n1", "n2", "n3"]
        for node in cluster.nodes:
            assert "came back on a new disk" not in node.log_path.read_text(), node.node_id

        cluster.kill(victim, signal.SIGKILL)
        docs = await cluster.wait_for(
            lambda d: (lead := leader_doc(d)) is not None and lead["fault_tolerance"] == {
                "voters": 3, "live_voters": 2, "can_lose": 0, "unheld": [victim.node_id]},
            WAIT, f"the leader saying it can lose no more voters while {victim.node_id} is dead")
        leader = cluster.node(leader_doc(docs)["node_id"])
        wait_until(lambda: "survives 0 more voter failure(s)" in leader.log_path.read_text(), WAIT,
                   f"{leader.node_id}'s warning that the cluster can lose no more voters")
        shutil.rmtree(victim.data_dir)
        cluster.start(victim)
        docs = await cluster.formed(3)  # removed under its old store, added back as a learner, promoted
        assert docs[victim.node_id]["uid"] != uid
        await cluster.wait_for(lambda d: (lead := leader_doc(d)) is not None and lead["fault_tolerance"] == FULL,
                               WAIT, "full fault tolerance again")
        got = cli("kv", "get", "after-the-clone", "--addr", victim.addr, "--json")
        assert got.returncode == 0 and json.loads(got.stdout)["value"] == "1", got

    try:
        run(scenario())
    finally:
        for clone in clones:
            if clone.running:
                cluster.kill(clone, signal.SIGKILL)
