"""A voter restarted on a wiped data dir under its old node id, while another voter is down: no
acknowledged write is lost, the survivor says why no leader can be elected, the leader replaces
the old identity by the new one, and every node ends with the same committed prefix (dpeer log)."""

from __future__ import annotations

import json
import signal

from tests.support.daemons import WAIT, Daemons, cli, force_when_allowed, run


def committed_prefix(addr: str, last: int) -> list[dict]:
    """`dpeer log --json --to last` of one node, parsed."""
    result = cli("log", "--addr", addr, "--to", str(last), "--json")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_a_voter_back_on_a_wiped_disk_loses_no_acknowledged_write(make_cluster) -> None:
    cluster: Daemons = make_cluster(3)
    cluster.start_all()
    n1, n2, n3 = cluster.nodes

    async def scenario() -> None:
        await cluster.formed(3)
        cluster.kill(n3, signal.SIGKILL)
        written = {f"k{i}": str(i) for i in range(5)}
        for key, value in written.items():  # acknowledged by n1 and n2 only
            put = cli("kv", "put", key, value, "--addr", n1.addr, "--timeout", "20")
            assert put.returncode == 0, put.stderr
        old_uid = (await cluster.status(n2))["uid"]
        cluster.kill(n1, signal.SIGKILL)
        cluster.kill(n2, signal.SIGKILL)
        aside = n2.data_dir.with_name(n2.data_dir.name + ".lost-disk")
        n2.data_dir.rename(aside)  # the disk is "lost": moved aside, never deleted
        cluster.start(n2)
        cluster.start(n3)
        docs = await cluster.wait_for(
            lambda d: d.get("n3") is not None and d["n3"]["no_leader"] is not None
            and "n2 lost its data" in d["n3"]["no_leader"]["reason"], WAIT,
            "n3 saying that n2 lost its data")
        assert docs["n2"]["uid"] != old_uid and docs["n2"]["leader"] is None
        assert docs["n3"]["leader"] is None and "1 of 3 voters can vote" in docs["n3"]["no_leader"]["reason"]
        cluster.start(n1)
        docs = await cluster.formed(3)  # n2 removed, added back as a learner, promoted
        leader = docs["n1"]["leader"]
        assert docs[leader]["strangers"] == [] and docs["n2"]["uid"] != old_uid
        for node in cluster.nodes:
            for key, value in written.items():
                got = cli("kv", "get", key, "--addr", node.addr, "--json")
                assert got.returncode == 0 and json.loads(got.stdout)["value"] == value, (node.node_id, got)
        commit = min(d["commit_index"] for d in (await cluster.statuses()).values() if d is not None)
        prefixes = [committed_prefix(node.addr, commit) for node in cluster.nodes]
        assert prefixes[0] == prefixes[1] == prefixes[2] and len(prefixes[0]) == commit
        assert (aside / "store" / "data.mdb").exists()

    run(scenario())


def test_two_voters_one_wiped_say_why_no_leader_and_force_brings_it_back(make_cluster) -> None:
    """Issue 14's liveness cousin: voters n1 and n2, n2 restarted on a wiped data dir. No leader
    can be elected (n1 alone is no majority, the new n2 is not the voter it was); n1's status
    and log say so and name the command; force on n1 (once allowed) brings the cluster back and
    n2 rejoins as a new member."""
    cluster: Daemons = make_cluster(2)
    cluster.start_all()
    n1, n2 = cluster.nodes

    async def scenario() -> None:
        await cluster.formed(2)
        assert cli("kv", "put", "before", "1", "--addr", n1.addr, "--timeout", "20").returncode == 0
        cluster.kill(n2, signal.SIGKILL)
        n2.data_dir.rename(n2.data_dir.with_name(n2.data_dir.name + ".lost-disk"))
        cluster.start(n2)
        docs = await cluster.wait_for(
            lambda d: d.get("n1") is not None and d["n1"]["no_leader"] is not None
            and "n2 lost its data" in d["n1"]["no_leader"]["reason"], WAIT, "n1 saying why no leader")
        why = docs["n1"]["no_leader"]
        assert "1 of 2 voters can vote (n1), 2 needed" in why["reason"], why
        assert f"dpeer force --addr {n1.addr} --voters n1 --yes" in why["action"], why
        human = cli("status", "--addr", n1.addr)
        assert "no leader for" in human.stdout and "what to do: if n2 will not come back" in human.stdout, human
        forced = await force_when_allowed(n1.addr, "n1")
        assert "cluster epoch 2" in forced.stdout
        docs = await cluster.formed(2)  # n2 joins as a learner under its new uid and is promoted
        assert docs["n1"]["epoch"] == docs["n2"]["epoch"] == 2 and docs["n1"]["forced"] == 1
        got = cli("kv", "get", "before", "--addr", n2.addr, "--json")
        assert got.returncode == 0 and json.loads(got.stdout)["value"] == "1", got
        logged = [line for line in n1.log_path.read_text().splitlines() if "no leader for" in line]
        assert any("n2 lost its data" in line and "dpeer force" in line for line in logged), logged

    run(scenario())
