"""Real daemons on loopback: configured sites reach the committed view, `dpeer status --json` and
`dpeer members`; a box restarted under another site moves in the next generation."""

from __future__ import annotations

import json
import signal

from tests.support.daemons import WAIT, cli, run


def _sites(doc: dict) -> dict[str, str | None]:
    return {m["node_id"]: m["site"] for m in doc["members"]}


def test_configured_sites_are_committed_in_the_view_and_shown(make_cluster) -> None:
    cluster = make_cluster(3)
    for node, site in zip(cluster.nodes, ["a", "a", "b"]):
        node.flags = ["--site", site]
    cluster.start_all()
    wanted = {"n1": "a", "n2": "a", "n3": "b"}

    def placed(docs: dict, sites: dict[str, str]) -> bool:
        return all(d is not None and d["group"] is not None
                   and dict(zip(d["group"]["members"], d["group"]["sites"])) == sites
                   and _sites(d) == sites for d in docs.values())

    async def scenario() -> None:
        await cluster.formed(3)
        docs = await cluster.wait_for(lambda docs: placed(docs, wanted), WAIT, "sites a, a, b in the view")
        for node_id, doc in docs.items():
            assert doc["site"] == wanted[node_id]
            assert doc["site_measure"]["configured"] == wanted[node_id] and doc["site_measure"]["near"] == []
        shown = cli("members", "--addr", cluster.node("n1").addr)
        assert shown.returncode == 0, shown.stderr
        header, *rows = shown.stdout.splitlines()
        assert header.split()[8] == "SITE"
        assert {row.split()[0]: row.split()[8] for row in rows} == wanted
        generation = docs["n1"]["group"]["generation"]

        n3 = cluster.node("n3")
        cluster.kill(n3, signal.SIGKILL)
        n3.flags = ["--site", "a"]
        cluster.start(n3)
        moved = dict.fromkeys(wanted, "a")
        docs = await cluster.wait_for(lambda docs: placed(docs, moved), WAIT, "n3 moved to site a")
        assert docs["n1"]["group"]["generation"] > generation
        as_json = json.loads(cli("status", "--json", "--addr", n3.addr).stdout)
        assert as_json["site"] == "a"

    run(scenario())


def test_boxes_that_name_no_site_are_placed_by_their_round_trips(make_cluster) -> None:
    """On loopback every link is fast: the three boxes measure each other near and form one site,
    named auto- and one of its node ids (the smallest of the first group measured: a group keeps
    the name most of its boxes had, so which one depends on which links were measured first);
    each box's status says which peers it measured near."""
    cluster = make_cluster(3)
    cluster.start_all()
    names = {"auto-n1", "auto-n2", "auto-n3"}

    def one_site(docs: dict) -> bool:
        return all(d is not None and d["group"] is not None and len(set(d["group"]["sites"])) == 1
                   and set(d["group"]["sites"]) <= names and set(_sites(d).values()) == set(d["group"]["sites"])
                   and d["site_measure"]["near"] for d in docs.values())

    async def scenario() -> None:
        await cluster.formed(3)
        docs = await cluster.wait_for(one_site, WAIT, "one measured site, auto- and one of its node ids")
        assert len({doc["group"]["sites"][0] for doc in docs.values()}) == 1, docs
        for node_id, doc in docs.items():
            assert doc["site"] == doc["group"]["sites"][0] and doc["site_measure"]["configured"] is None
            assert set(doc["site_measure"]["near"]) <= {"n1", "n2", "n3"} - {node_id}
            assert doc["site_measure"]["near_ms"] < doc["site_measure"]["far_ms"]

    run(scenario())
