"""Member identities and cluster epochs in RaftNode: what a node notes of each peer's store uid
and epoch, which messages it may act on, and how it refuses voters of an older epoch.

A mixin like replication.LeaderSide, over the RaftNode state host.RaftHost declares.
A member is its node id plus its store uid (see voting.py): answers are counted only from the
store the configuration names, and a node that hears a newer epoch from a member gave up on by
a forced reconfiguration stops campaigning, leading and voting for older-epoch candidates.
"""

from __future__ import annotations

import logging

from dpeer.consensus.messages import (
    AppendRequest,
    AppendResponse,
    RaftHeartbeat,
    RaftHeartbeatResponse,
    Message,
    Peer,
    SnapshotRequest,
    VoteRequest,
    VoteResponse,
)
from dpeer.consensus.config import RaftConfig
from dpeer.consensus.host import RaftHost
from dpeer.consensus.ready import Outgoing, Role

log = logging.getLogger("dpeer.consensus.core")
_LEADER_MSGS = (AppendRequest, RaftHeartbeat, SnapshotRequest)
_ANSWERS = (VoteResponse, AppendResponse, RaftHeartbeatResponse)


def answer_window(cfg: RaftConfig) -> float:
    """How long a live voter can go without answering the leader: two of the slowest beats it gets."""
    return 2 * max(cfg.election_timeout_max, cfg.idle_heartbeat_interval)


class IdentitySide(RaftHost):
    """Identity and epoch bookkeeping of RaftNode."""

    @property
    def epoch(self) -> int:
        """The cluster epoch of the configuration in force (0 before any)."""
        return self.membership.epoch

    @property
    def identity(self) -> Peer:
        """How this node signs what it sends: node id, store uid, cluster epoch."""
        return Peer(self.id, self.uid, self.epoch)

    @property
    def superseded(self) -> bool:
        """A peer follows a newer cluster epoch: a forced reconfiguration gave up on ours, so we
        neither campaign nor vote for a candidate of an older epoch until we follow it too."""
        return self.newest_epoch > self.epoch

    def leaderless_for(self, now: float) -> float:
        """Seconds since this node last knew a leader (0 while it leads)."""
        return 0.0 if self.role is Role.LEADER else max(0.0, now - self._leader_seen_at)

    def strangers(self) -> dict[str, str]:
        """Members of the configuration in force last seen with another store uid than the one
        it names (a box that lost its disk): node id -> the uid seen."""
        conf = self.membership
        return {n: u for n, u in self.seen_uids.items() if conf.uid_of(n) not in (None, u)}

    def answering_voters(self, now: float) -> set[str] | None:
        """On the leader: the voters that answered it under the store uid the configuration names
        within two of the slowest beats a live voter answers (itself included), as the strict
        reconfiguration check counts them; None on any other node."""
        if self.role is not Role.LEADER:
            return None
        since = now - answer_window(self.cfg)
        return set(self.tracker.live(sorted(self.membership.voters), self.id, since))

    def observe(self, sender: Peer) -> None:
        """Note a peer's identity from any message it sent (gossip included), and its epoch when
        the configuration names it with that uid (a stranger cannot silence us with a big one)."""
        self.seen_uids[sender.node_id] = sender.uid
        if self.membership.is_member(sender.node_id, sender.uid):
            self.newest_epoch = max(self.newest_epoch, sender.epoch)

    def _admit(self, sender: Peer, msg: Message) -> bool:
        """Whether the core may act on a message of sender (see step)."""
        src, conf = sender.node_id, self.membership
        named = conf.uid_of(src)
        if named == sender.uid:
            self._heard[src] = self._now
            return True
        if named is None and 0 < sender.epoch < conf.epoch:
            self._refuse_old_epoch(sender, msg)
            return False
        return not isinstance(msg, _ANSWERS)

    def _refuse_old_epoch(self, sender: Peer, msg: Message) -> None:
        """A non-member of an older epoch (a voter given up on by a forced reconfiguration that
        came back on its old disk): note it, and answer a request so our reply, stamped with our
        epoch, tells it to stop campaigning or leading."""
        if sender.node_id not in self.old_epoch_peers:
            log.warning("%s: refusing %s, a member of cluster epoch %d; this cluster is in epoch %d since a forced "
                        "reconfiguration: %s must move its data dir aside and rejoin as a new member", self.id,
                        sender.node_id, sender.epoch, self.epoch, sender.node_id)
        self.old_epoch_peers[sender.node_id] = sender.epoch
        reply = (VoteResponse(self.term, False, msg.pre_vote, "old_epoch") if isinstance(msg, VoteRequest)
                 else AppendResponse(self.term, False, 0) if isinstance(msg, _LEADER_MSGS) else None)
        if reply is not None:
            self._msgs.append(Outgoing(sender.node_id, sender.uid, reply))
