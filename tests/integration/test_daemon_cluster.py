"""Real daemons on loopback: failure detection, leader failover, catch-up and quorum loss."""

from __future__ import annotations

import asyncio
import json
import signal

from dpeer.transport.client import NodeClient
from tests.support.daemons import WAIT, cli, force_when_allowed, run, states_by


def test_five_daemons_detect_kill_and_stop(make_cluster) -> None:
    cluster = make_cluster(5)
    cluster.start_all()

    async def scenario() -> None:
        await cluster.formed(5)
        n4, n5 = cluster.node("n4"), cluster.node("n5")
        cluster.kill(n5, signal.SIGKILL)
        cluster.kill(n4, signal.SIGSTOP)
        survivors = ["n1", "n2", "n3"]

        def dead_seen(docs: dict) -> bool:
            return all(docs.get(s) and states_by(docs, s).get("n5") == "dead"
                       and states_by(docs, s).get("n4") == "dead" for s in survivors)
        await cluster.wait_for(dead_seen, WAIT, "n4 (stopped) and n5 (killed) dead at every survivor")
        cluster.kill(n4, signal.SIGCONT)

        def back(docs: dict) -> bool:
            return all(docs.get(s) and states_by(docs, s).get("n4") == "alive" for s in survivors + ["n4"])
        docs = await cluster.wait_for(back, WAIT, "n4 alive again after SIGCONT")
        assert all(states_by(docs, s)["n5"] == "dead" for s in survivors)

    run(scenario())


def test_an_idle_leader_killed_is_replaced_and_writes_commit_again(make_cluster) -> None:
    """With nothing to replicate the leader beats slowly (6 s follower leases on lan), so the
    survivors elect its successor through gossip's dead verdict (leader_lost), not a lease."""
    cluster = make_cluster(3)
    cluster.start_all()

    async def scenario() -> None:
        docs = await cluster.formed(3)
        old = cluster.node(next(iter(docs.values()))["leader"])
        old_term = docs[old.node_id]["term"]

        def idle_beats(docs: dict) -> bool:  # a leader idles election_timeout_max after its last entry
            return all(d is not None and d["leader"] == old.node_id for d in docs.values())
        await cluster.wait_for(idle_beats, WAIT, "an undisturbed leader")
        await asyncio.sleep(2.0)
        cluster.kill(old, signal.SIGKILL)

        def successor(docs: dict) -> bool:
            live = [d for n, d in docs.items() if n != old.node_id and d is not None]
            return len(live) == 2 and all(d["leader"] not in (None, old.node_id) and d["term"] > old_term
                                          for d in live)
        docs = await cluster.wait_for(successor, WAIT, "a new leader after the idle leader's kill")
        survivor = next(n for n in cluster.nodes if n is not old)
        async with NodeClient(survivor.addr, timeout=20) as client:
            assert (await client.kv_put("after", "kill")).committed

    run(scenario())


def test_restarted_node_fetches_only_what_it_missed(make_cluster) -> None:
    cluster = make_cluster(3)
    cluster.start_all()

    async def scenario() -> None:
        await cluster.formed(3)
        n3 = cluster.node("n3")
        before = (await cluster.status(n3))["last_applied"]
        cluster.kill(n3, signal.SIGKILL)
        async with NodeClient(cluster.node("n1").addr, timeout=20) as client:
            for i in range(40):
                assert (await client.kv_put(f"k{i}", str(i))).committed
        cluster.start(n3)

        def caught_up(docs: dict) -> bool:
            d1, d3 = docs.get("n1"), docs.get("n3")
            return bool(d1 and d3 and d3["last_applied"] >= d1["commit_index"] and d3["group"])
        docs = await cluster.wait_for(caught_up, WAIT, "n3 caught up after restart")
        d3 = docs["n3"]
        missed = docs["n1"]["commit_index"] - before
        # every entry n3 wrote since its restart, whether the leader sent it or a resync fetched it
        written, resynced = d3["entries_written"], d3["resync"]["fetched_entries"]
        assert 40 <= written <= missed + 10 and resynced <= written, (written, resynced, missed, before)
        for fetch in d3["resync"]["fetches"]:
            assert fetch["from"] > before

    run(scenario())


def test_acknowledged_writes_survive_leader_and_follower_kills(make_cluster) -> None:
    cluster = make_cluster(5)
    cluster.start_all()

    async def scenario() -> None:
        docs = await cluster.formed(5)
        leader = cluster.node(next(iter(docs.values()))["leader"])
        acked: dict[str, str] = {}

        async def writer(stop: asyncio.Event) -> None:
            i = 0
            while not stop.is_set():
                for node in cluster.nodes:
                    if not node.running:
                        continue
                    key, value = f"w{i}", f"v{i}"
                    result = cli("kv", "put", key, value, "--addr", node.addr, "--timeout", "5")
                    if result.returncode == 0:
                        acked[key] = value
                    i += 1
                    break
                await asyncio.sleep(0)

        stop = asyncio.Event()
        task = asyncio.create_task(writer(stop))
        await asyncio.sleep(1.0)
        cluster.kill(leader, signal.SIGKILL)
        await asyncio.sleep(2.0)
        follower = next(n for n in cluster.nodes if n.running and n is not leader)
        cluster.kill(follower, signal.SIGKILL)
        await asyncio.sleep(2.0)
        cluster.start(leader)
        cluster.start(follower)
        await asyncio.sleep(2.0)
        stop.set()
        await task
        await cluster.formed(5)
        assert len(acked) >= 5, acked
        for node in cluster.nodes:
            for key, value in acked.items():
                result = cli("kv", "get", key, "--addr", node.addr, "--json")
                assert result.returncode == 0, (node.node_id, key, result.stderr)
                assert json.loads(result.stdout)["value"] == value

    asyncio.run(scenario())


def test_two_of_five_lost_keeps_working_three_halts_without_damage(make_cluster) -> None:
    cluster = make_cluster(5)
    cluster.start_all()

    async def scenario() -> None:
        docs = await cluster.formed(5)
        leader = next(iter(docs.values()))["leader"]
        voters = docs[leader]["voters"]
        assert len(voters) == 5
        killed = [n for n in cluster.nodes if n.node_id != leader][:2]
        for node in killed:
            cluster.kill(node, signal.SIGKILL)
        addr = cluster.node(leader).addr
        assert cli("kv", "put", "two-down", "yes", "--addr", addr, "--timeout", "20").returncode == 0
        third = next(n for n in cluster.nodes if n.running and n.node_id != leader)
        cluster.kill(third, signal.SIGKILL)
        halted = cli("kv", "put", "three-down", "no", "--addr", addr, "--timeout", "3")
        assert halted.returncode != 0, halted.stdout
        for node in killed + [third]:
            cluster.start(node)
        await cluster.formed(5)
        for node in cluster.nodes:
            got = cli("kv", "get", "two-down", "--addr", node.addr, "--json")
            assert got.returncode == 0 and json.loads(got.stdout)["value"] == "yes", got

    run(scenario())


def test_forced_reconfiguration_recovers_a_lost_majority(make_cluster) -> None:
    cluster = make_cluster(3)
    cluster.start_all()

    async def scenario() -> None:
        docs = await cluster.formed(3)
        survivor = cluster.node(next(iter(docs.values()))["leader"])
        assert cli("kv", "put", "before", "1", "--addr", survivor.addr).returncode == 0
        lost = [n for n in cluster.nodes if n is not survivor]
        for node in lost:
            cluster.kill(node, signal.SIGKILL)
        assert cli("kv", "put", "halted", "1", "--addr", survivor.addr, "--timeout", "3").returncode != 0
        refused = cli("force", "--addr", survivor.addr, "--voters", survivor.node_id)
        assert refused.returncode == 2 and "--yes" in refused.stderr
        early = cli("force", "--addr", survivor.addr, "--voters", survivor.node_id, "--yes")
        assert early.returncode == 1 and "force refused: a leader was known" in early.stderr, early.stderr
        forced = await force_when_allowed(survivor.addr, survivor.node_id)
        assert "cluster epoch 2" in forced.stdout, forced.stdout
        doc = await cluster.status(survivor)
        assert doc is not None and doc["epoch"] == 2 and doc["forced_at"] is not None and doc["forced"] == 1
        assert cli("kv", "put", "after", "1", "--addr", survivor.addr, "--timeout", "20").returncode == 0
        for node in lost:
            # As after etcd's --force-new-cluster: the lost voters come back on fresh data dirs
            # (the old ones moved aside); on their old logs they could elect each other under
            # the old configuration and commit entries the forced cluster never sees.
            node.data_dir.rename(node.data_dir.with_name(node.data_dir.name + ".before-force"))
            cluster.start(node)
        await cluster.formed(3)
        for node in cluster.nodes:
            for key in ("before", "after"):
                assert cli("kv", "get", key, "--addr", node.addr).returncode == 0, (node.node_id, key)

    run(scenario())
