"""The config's timing keys reach the node: each unset key is the preset's, each set one wins."""

from __future__ import annotations

from pathlib import Path

from dpeer.daemon.config import NodeConfig
from dpeer.daemon.node.driver import Node
from dpeer.daemon.timing import LEADER_PRESETS, preset_values
from dpeer.statemachine.store import Store


def test_a_nodes_timings_are_the_presets_overridden_key_by_key(tmp_path: Path) -> None:
    config = NodeConfig.model_validate({"preset": "wan", "max_voters": 3, "timing": {
        "raft": {"heartbeat_interval": 0.3}, "membership": {"probe_interval": 4.0},
        "leader": {"quiet_window": 1.5}}})
    timing = config.resolved_timing()
    store = Store.open(tmp_path / "store", node_id="n1")
    try:
        node = Node("n1", "127.0.0.1:1", store, lambda *a: None, preset=config.preset,
                    max_voters=config.max_voters, timing=timing)
        wan = preset_values("wan")
        assert node.raft_config.heartbeat_interval == 0.3 and node.raft_config.max_voters == 3
        assert node.raft_config.election_timeout_min == wan["raft"]["election_timeout_min"]
        assert node.swim.config.probe_interval == 4.0
        assert node.swim.config.probe_timeout == wan["membership"]["probe_timeout"]
        assert timing.leader.quiet_window == 1.5
        assert timing.leader.dead_voter_grace == LEADER_PRESETS["wan"].dead_voter_grace
    finally:
        store.close()
