"""The contract between RaftNode and its halves (replication, follower, force, identity).

RaftNode is written as one class in several files: each half is a mixin over RaftHost, which
declares the state they share (RaftNode.__init__ sets every field) and the operations RaftNode
defines for them. A reader of one half sees here what it may touch; nothing else is shared.
"""

from __future__ import annotations

from typing import Any, Callable

from dpeer.consensus.config import RaftConfig
from dpeer.consensus.log import RaftLog
from dpeer.consensus.progress import Tracker
from dpeer.consensus.ready import Outgoing, ReadState, Role
from dpeer.consensus.voting import History, VotingConfig
from dpeer.consensus.entry import Entry


class RaftHost:
    """What RaftNode provides to its halves; never instantiated alone."""

    # Identity and configuration.
    id: str
    uid: str
    cfg: RaftConfig
    log: RaftLog
    tracker: Tracker
    _conf_history: History  # (index, configuration) pairs; the last one is in force
    membership: VotingConfig  # a property of RaftNode: the configuration in force

    # Term, role and the leader as this node knows them.
    term: int
    role: Role
    leader: str | None

    # Time: the `now` of the input being handled, and the timers it moves.
    _now: float
    _heartbeat_due: float
    _learner_heartbeat_due: float
    _quorum_check_due: float
    _active_at: float  # when the leader last appended, committed or read (idle beats after)
    _beat_idle: bool
    _leader_contact: float  # when a leader's message last reached us (its lease runs from here)
    _lease: float
    _leader_seen_at: float  # when a leader (or this node leading) was last known

    # ReadIndex, outgoing work and what each peer's store last showed us.
    _read_seq: int
    _pending_reads: list[list[Any]]  # [request_id, index or None]
    _read_states: list[ReadState]
    _msgs: list[Outgoing]
    _heard: dict[str, float]  # when each member last reached us under its uid
    seen_uids: dict[str, str]
    newest_epoch: int
    old_epoch_peers: dict[str, int]
    diverged_at: int

    # Operations RaftNode defines for its halves.
    _send: Callable[[str, Any], None]  # queue a message for a member, meant for its store
    _reply: Callable[[Any], None]  # queue a message for the sender of the message being stepped
    _append: Callable[[list[Entry]], None]  # append, following configuration changes
    _become_follower: Callable[[int, str | None], None]
    _reset_election_timer: Callable[..., None]
    _campaign: Callable[[bool], None]
    leaderless_for: Callable[[float], float]  # defined by the identity half
