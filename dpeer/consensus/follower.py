"""Follower: what a RaftNode does under a leader: leader messages, log matching, snapshots,
committed resync.

Every acknowledgement claims only a match this node checked: an append that reaches below our commit index is compared entry by entry with what we
committed, never answered "matches up to our commit index" on trust.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable

from dpeer.consensus.log import check_committed_batch
from dpeer.consensus.messages import (
    AppendRequest,
    AppendResponse,
    RaftHeartbeat,
    RaftHeartbeatResponse,
    Peer,
    SnapshotRequest,
)
from dpeer.consensus.ready import AcceptResult, Role
from dpeer.consensus.storage import Snapshot
from dpeer.consensus.entry import Entry

if TYPE_CHECKING:
    from dpeer.consensus.core import RaftNode

log = logging.getLogger("dpeer.consensus.core")


class Follower:
    """The follower's side of a RaftNode; diverged_at: an index where a leader's entry differed
    from our committed one (0 if never), for the caller's status."""

    def __init__(self, node: RaftNode) -> None:
        self.node = node
        self.diverged_at = 0

    def on_leader_message(self, src: str, m: AppendRequest | RaftHeartbeat | SnapshotRequest) -> None:
        """Follow src, renew its lease, and handle its append, heartbeat or snapshot."""
        node = self.node
        if node.role is Role.LEADER:
            return
        if node.role is not Role.FOLLOWER or node.leader != src:
            node.election.follow(node.term, src)
        idle = isinstance(m, RaftHeartbeat) and m.idle and node.cfg.idle_heartbeat_interval > 0
        node.election.heard_leader(idle)
        if isinstance(m, AppendRequest):
            self._on_append(m)
        elif isinstance(m, RaftHeartbeat):
            node.log.commit_to(m.commit)
            node.out.reply(RaftHeartbeatResponse(node.term, m.read_seq))
        else:
            self._on_snapshot(m)

    def _on_append(self, m: AppendRequest) -> None:
        """Log matching: accept after (prev_index, prev_term) or reject with a backoff hint."""
        node = self.node
        if m.prev_index < node.log.committed:
            checked = self._check_below_commit(m)
            if checked is None:
                return
            m = checked
        if not node.log.match_term(m.prev_index, m.prev_term):
            hint, hint_term = node.log.find_conflict_by_term(m.prev_index, m.prev_term)
            node.out.reply(AppendResponse(node.term, False, m.prev_index, hint, hint_term))
            return
        conflict = node.log.find_conflict(m.entries)
        if conflict:
            self._append(list(m.entries[conflict - m.entries[0].index:]))
        last_new = m.prev_index + len(m.entries)
        node.log.commit_to(min(m.commit, last_new))
        node.out.reply(AppendResponse(node.term, True, last_new))

    def _check_below_commit(self, m: AppendRequest) -> AppendRequest | None:
        """An append reaching below our commit index: compare what it overlaps with our committed
        entries. All checked up to our commit index: the rest of the message, after it. Checked
        only partway: acknowledge that far and no further. A committed entry that differs, or
        nothing we could check (compacted here): no answer, since no match was verified."""
        node = self.node
        committed, verified = node.log.committed, None
        for index, leader_term in [(m.prev_index, m.prev_term)] + [(e.index, e.term) for e in m.entries]:
            if index > committed:
                break
            term = node.log.term(index)
            if term is None:
                continue
            if term != leader_term:
                self.diverged_at = index
                log.error("%s: leader %s has entry %d of term %d, but this node committed term %d there: "
                          "the logs diverged on committed entries; not acknowledging", node.id, m.leader,
                          index, leader_term, term)
                return None
            verified = index
        if verified is None:
            return None
        if verified < committed:
            node.out.reply(AppendResponse(node.term, True, verified))
            return None
        rest = tuple(e for e in m.entries if e.index > committed)
        return replace(m, prev_index=committed, prev_term=node.log.term(committed), entries=rest)

    def _on_snapshot(self, m: SnapshotRequest) -> None:
        node = self.node
        if m.index <= node.log.committed:
            if node.log.match_term(m.index, m.term_of_index):
                node.out.reply(AppendResponse(node.term, True, m.index))
            return
        if node.log.match_term(m.index, m.term_of_index):
            node.log.commit_to(m.index)
        else:
            node.log.restore(Snapshot(m.index, m.term_of_index, m.data, m.membership))
            node.confs.restored(m.index, m.membership)
        node.out.reply(AppendResponse(node.term, True, node.log.committed))

    def accept_committed(self, entries: Iterable[Entry], commit_index: int, sender: Peer,
                         sender_term: int) -> AcceptResult:
        """Take entries committed elsewhere (fetched from a peer; commit_index and sender_term
        being that peer's). Only from a member of the configuration in force, by identity, in our
        epoch, with no entry of a term above the sender's own. The batch must start at or below
        our commit index so the entry before the first new one is checked (log matching);
        committed entries are never truncated."""
        node = self.node
        batch = list(entries)
        if node.role is Role.LEADER or not batch:
            return AcceptResult(not batch, node.log.committed, "" if not batch else "leader")
        lo = node.log.committed
        problem = self._untrusted_source(batch, sender, sender_term) or check_committed_batch(batch, commit_index, lo)
        if problem:
            return AcceptResult(False, lo, problem)
        for e in batch:
            if e.index <= lo and node.log.term(e.index) not in (None, e.term):
                return AcceptResult(False, lo, f"entry {e.index} conflicts with a committed entry")
        fresh = [e for e in batch if e.index > lo]
        conflict = node.log.find_conflict(fresh)
        if conflict:
            self._append(fresh[conflict - fresh[0].index:])
        if fresh:
            node.log.commit_to(fresh[-1].index)
        return AcceptResult(True, node.log.committed)

    def _append(self, entries: list[Entry]) -> None:
        """Append entries from a leader or a peer, following any configuration they add or
        truncate away (the tracker is the leader's, so a follower has none to reset)."""
        self.node.log.append(entries)
        self.node.confs.appended(entries)

    def _untrusted_source(self, batch: list[Entry], sender: Peer, sender_term: int) -> str:
        """Why committed entries from sender cannot be taken, or '' when they may."""
        conf = self.node.membership
        if sender.node_id == self.node.id or not conf.is_member(sender.node_id, sender.uid):
            return (f"{sender.node_id} (store {sender.uid[:8]}) is not a member of the configuration in "
                    f"force here")
        if sender.epoch != conf.epoch:
            return f"{sender.node_id} follows cluster epoch {sender.epoch}, this node epoch {conf.epoch}"
        high = max(e.term for e in batch)
        if high > sender_term:
            return f"an entry of term {high} is above the sender's term {sender_term}"
        return ""
