"""Timing and size settings of the Raft core, with presets in the memberlist manner.

Every duration is in seconds of the caller's clock. The election timeout is drawn uniformly
from [election_timeout_min, election_timeout_max) at every reset, so split votes resolve fast.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RaftConfig:
    """Timeouts and limits for one RaftNode; validate() runs at construction.

    learner_heartbeat_interval: how often the leader beats learners, which neither vote nor
    campaign, so their beats only carry the commit index and the leader's term (new entries,
    commits and elections reach them at once anyway); 0 means every heartbeat_interval.

    Idle leaders (0 disables): once nothing was appended, committed or read for two
    heartbeat_intervals and every voter holds the whole log, the leader beats voters every
    idle_heartbeat_interval and learners every idle_learner_heartbeat_interval (a learner
    that lacks entries with the voters), marking the beats idle. A follower that
    gets an idle beat holds the leader's lease and waits idle_election_timeout (randomised up
    to 1.5x) before campaigning. A dead leader is found sooner through RaftNode.leader_lost(),
    which the driver calls when its failure detector declares the leader dead; any new entry
    ends the idle period at once.
    """

    heartbeat_interval: float
    election_timeout_min: float
    election_timeout_max: float
    learner_heartbeat_interval: float = 0.0
    idle_heartbeat_interval: float = 0.0
    idle_learner_heartbeat_interval: float = 0.0
    idle_election_timeout: float = 0.0
    max_voters: int = 5
    max_entries_per_msg: int = 256
    max_bytes_per_msg: int = 1 << 20

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError unless heartbeat < election_min < election_max and limits are positive."""
        if not 0 < self.heartbeat_interval < self.election_timeout_min:
            raise ValueError("heartbeat_interval must be positive and below election_timeout_min")
        if self.learner_heartbeat_interval and self.learner_heartbeat_interval < self.heartbeat_interval:
            raise ValueError("learner_heartbeat_interval must be 0 or at least heartbeat_interval")
        if not self.election_timeout_min < self.election_timeout_max:
            raise ValueError("election_timeout_min must be below election_timeout_max")
        self._validate_idle()
        if self.max_voters < 1 or self.max_entries_per_msg < 1 or self.max_bytes_per_msg < 1:
            raise ValueError("max_voters, max_entries_per_msg and max_bytes_per_msg must be >= 1")

    def _validate_idle(self) -> None:
        """Idle beats are slower than busy ones, and an idle follower waits out three of them."""
        beat = self.idle_heartbeat_interval
        if not beat:
            if self.idle_learner_heartbeat_interval or self.idle_election_timeout:
                raise ValueError("idle_* settings need idle_heartbeat_interval > 0")
            return
        if beat < self.heartbeat_interval:
            raise ValueError("idle_heartbeat_interval must be 0 or at least heartbeat_interval")
        if self.idle_learner_heartbeat_interval < beat:
            raise ValueError("idle_learner_heartbeat_interval must be at least idle_heartbeat_interval")
        if self.idle_election_timeout < max(3 * beat, self.election_timeout_max):
            raise ValueError("idle_election_timeout must cover 3 idle beats and election_timeout_max")


# LAN: one switch, RTT well under 1 ms, a durable LMDB commit 0.4-0.6 ms. A heartbeat every
# 100 ms (etcd's default) keeps followers' leases fresh with 3-6 beats per timeout, so a lost
# beat or two never starts an election; a 300-600 ms randomised timeout finds a new leader in
# about 0.5 s after a crash (timeout + one pre-vote and one vote round trip + the vote fsync),
# inside the 1 s target. 50 ms beats cost the leader twice the idle CPU (one Python gRPC call
# per follower per beat, measured in BENCHMARKS.md "Agreement") for no faster failover.
# Learners are beaten every 1 s: with 12 learners that cuts the leader's idle messages by
# 2/3 (BENCHMARKS.md "Membership", real processes) and changes no failover figure.
# An idle LAN leader beats voters every 4 s and learners every 30 s (a learner that lacks
# entries is beaten with the voters, so its gap is filled within 4 s): with 4 voters and 12
# learners that is 70x fewer messages than 100 ms beats, and brings the leader's idle CPU to
# about a follower's (BENCHMARKS.md "Membership"). A killed leader is still replaced in about
# 0.3 s, since gossip declares it dead in about 0.23 s (a refused connection) and leader_lost()
# starts the election; a SIGSTOPped one once gossip declares it dead (about 2.5 s), or at the
# latest after 12-18 s of silence (three lost idle beats).
LAN = RaftConfig(heartbeat_interval=0.1, election_timeout_min=0.3, election_timeout_max=0.6,
                 learner_heartbeat_interval=1.0, idle_heartbeat_interval=4.0,
                 idle_learner_heartbeat_interval=30.0, idle_election_timeout=12.0)

# WAN / hybrid cloud: RTT 20-150 ms with jitter. Timeouts scale ~5x so a slow round trip or a
# GC pause never looks like a dead leader; failover takes 1.5-3 s. Idle: voters every 5 s,
# learners every 40 s, a silent leader replaced after 15-22 s (gossip declares a dead one sooner).
WAN = RaftConfig(heartbeat_interval=0.25, election_timeout_min=1.5, election_timeout_max=3.0,
                 learner_heartbeat_interval=2.5, idle_heartbeat_interval=5.0,
                 idle_learner_heartbeat_interval=40.0, idle_election_timeout=15.0)

# Edge: flaky Wi-Fi/LTE links, loss bursts of seconds, slow SD-card fsync. Favour stability over
# failover speed: a leader is replaced only after 4-8 s of silence. Idle: voters every 10 s,
# learners every 60 s (metered links pay for every beat), a silent leader replaced after 30-45 s.
EDGE = RaftConfig(heartbeat_interval=0.5, election_timeout_min=4.0, election_timeout_max=8.0,
                  learner_heartbeat_interval=5.0, idle_heartbeat_interval=10.0,
                  idle_learner_heartbeat_interval=60.0, idle_election_timeout=30.0)

PRESETS: dict[str, RaftConfig] = {"lan": LAN, "wan": WAN, "edge": EDGE}
