"""`dpeer chaos --netns` without running a cluster: the flag, where each node is placed, and the
clear refusal where namespaces cannot be made (the real-partition run itself is in BENCHMARKS.md,
and tests/integration/test_netns_partition.py cuts a link under real daemons)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from dpeer.chaos import netns, options
from dpeer.chaos import run as chaos_run
from dpeer.launch.cluster import LocalCluster


def test_the_flag_reaches_the_options() -> None:
    p = argparse.ArgumentParser()
    options.add_arguments(p)
    assert options.options_from(p.parse_args(["--netns"])).netns
    assert not options.options_from(p.parse_args([])).netns


def test_a_placed_node_listens_on_its_host_and_starts_through_its_prefix(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 3, base_port=41000,
                           placement=lambda i: (f"10.1.2.{i}", ["ip", "netns", "exec", f"ns{i}"]))
    assert [n.addr for n in cluster.nodes] == ["10.1.2.1:41000", "10.1.2.2:41002", "10.1.2.3:41004"]
    assert cluster.node("n2").prefix == ["ip", "netns", "exec", "ns2"]
    assert [n.addr for n in LocalCluster(tmp_path / "lo", 1, base_port=41000).nodes] == ["127.0.0.1:41000"]


def test_netns_is_refused_with_the_reason_where_namespaces_cannot_be_made(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(chaos_run, "why_not", lambda: "network namespaces need root")
    with pytest.raises(ValueError, match="--netns: network namespaces need root"):
        chaos_run._namespaces(tmp_path, 3)


def test_two_runs_at_once_get_subnets_of_their_own() -> None:
    subnets = [netns.subnet_of(tag) for tag in range(10000)]
    assert len(set(subnets)) == len(subnets)
    assert all(0 <= int(octet) <= 255 for s in subnets for octet in s.split("."))


def test_a_setup_that_collides_with_a_live_run_fails_clearly_and_leaves_that_run_alone(tmp_path: Path) -> None:
    reason = netns.why_not()
    if reason:
        pytest.skip(reason)
    first = netns.Net(tmp_path / "a", 1, tag="9998")
    try:
        with pytest.raises(ValueError, match="cannot set up the network namespaces"):
            netns.Net(tmp_path / "b", 1, tag="9998")  # the same names: its bridge exists already
        assert netns.subprocess.run(["ip", "link", "show", first.bridge], capture_output=True).returncode == 0
        assert netns.subprocess.run(["ip", "netns", "exec", first.ns(1), "true"], capture_output=True).returncode == 0
    finally:
        first.close()
    assert netns.subprocess.run(["ip", "link", "show", first.bridge], capture_output=True).returncode != 0
