"""Member identities and cluster epochs: which messages a RaftNode may act on, and how it
answers a voter of an older epoch.

A member is its node id plus its store uid (see voting.py): answers are counted only from the
store the configuration names, and a node that hears a newer epoch from a member gave up on by
a forced reconfiguration stops campaigning, leading and voting for older-epoch candidates.
RaftNode keeps what it noted of each peer (seen_uids, newest_epoch, old_epoch_peers).
"""

from __future__ import annotations

from dpeer.consensus.config import RaftConfig
from dpeer.consensus.messages import (
    AppendResponse,
    Message,
    RaftHeartbeatResponse,
    VoteRequest,
    VoteResponse,
)
from dpeer.consensus.election import LEADER_MSGS

ANSWERS = (VoteResponse, AppendResponse, RaftHeartbeatResponse)  # counted only from the store a configuration names


def old_epoch_reply(term: int, msg: Message) -> Message | None:
    """The answer to a request of a voter given up on by a forced reconfiguration: stamped with
    our epoch, it tells that voter to stop campaigning or leading (None for anything else)."""
    if isinstance(msg, VoteRequest):
        return VoteResponse(term, False, msg.pre_vote, "old_epoch")
    if isinstance(msg, LEADER_MSGS):
        return AppendResponse(term, False, 0)
    return None


def answer_window(cfg: RaftConfig) -> float:
    """How long a live voter can go without answering the leader: two of the slowest beats it gets."""
    return 2 * max(cfg.election_timeout_max, cfg.idle_heartbeat_interval)
