"""A node's timings: the preset's (lan, wan, edge), overridden key by key by the config's `timing`.

Three groups, each a config section: ``timing.membership`` (the SWIM failure detector's knobs,
membership/config.py), ``timing.raft`` (heartbeats and election timeouts, consensus/config.py)
and ``timing.leader`` (how long the leader lets membership settle before it changes the training
group, and how long a dead voter is waited for). `dpeer config show` prints the effective values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

from dpeer.consensus.config import PRESETS as RAFT_PRESETS
from dpeer.consensus.config import RaftConfig
from dpeer.membership.config import MembershipConfig
from dpeer.membership.config import preset as membership_preset


@dataclass(frozen=True)
class LeaderTiming:
    """The leader's waits, in seconds."""

    quiet_window: float  # wanted members hold still this long before a view change (folds failures)
    confirmed_quiet: float  # the same when the group itself reported the failure gossip suspects
    dead_voter_grace: float  # a voter dead this long is replaced by a learner
    failure_grace: float  # a failed group waits this long for gossip to explain it before re-forming


LEADER_PRESETS = {
    "lan": LeaderTiming(quiet_window=0.1, confirmed_quiet=0.02, dead_voter_grace=30.0, failure_grace=0.5),
    "wan": LeaderTiming(quiet_window=0.5, confirmed_quiet=0.1, dead_voter_grace=60.0, failure_grace=2.0),
    "edge": LeaderTiming(quiet_window=2.0, confirmed_quiet=0.5, dead_voter_grace=300.0, failure_grace=5.0),
}
# The Raft knobs that are timings (the rest are sizes: max_voters is a config key of its own).
RAFT_KEYS = ("heartbeat_interval", "election_timeout_min", "election_timeout_max", "learner_heartbeat_interval",
             "idle_heartbeat_interval", "idle_learner_heartbeat_interval", "idle_election_timeout")
MEMBERSHIP_KEYS = tuple(f.name for f in fields(MembershipConfig))
LEADER_KEYS = tuple(f.name for f in fields(LeaderTiming))


@dataclass(frozen=True)
class Timing:
    """Every timing a daemon runs with."""

    membership: MembershipConfig
    raft: RaftConfig
    leader: LeaderTiming


def preset_values(preset: str) -> dict[str, dict[str, Any]]:
    """The preset's timings as {section: {key: value}}, the shape of the config's `timing`."""
    raft = asdict(RAFT_PRESETS[preset])
    return {"membership": asdict(membership_preset(preset)), "raft": {k: raft[k] for k in RAFT_KEYS},
            "leader": asdict(LEADER_PRESETS[preset])}


def resolve(preset: str, overrides: Mapping[str, Mapping[str, Any]], max_voters: int = 5) -> Timing:
    """The preset's timings with the overrides applied; ValueError when they contradict each other
    (a heartbeat slower than the election timeout, say)."""
    raft = replace(RAFT_PRESETS[preset], **dict(overrides.get("raft", {})), max_voters=max_voters)
    return Timing(membership=replace(membership_preset(preset), **dict(overrides.get("membership", {}))),
                  raft=raft, leader=replace(LEADER_PRESETS[preset], **dict(overrides.get("leader", {}))))
