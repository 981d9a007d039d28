"""The leader's half of RaftNode: heartbeats, check-quorum, replication, commit, ReadIndex.

A mixin so core.py stays about roles and elections; the RaftNode state it uses is declared
by host.RaftHost, and it is never instantiated alone.
"""

from __future__ import annotations

import logging
from typing import Any

from dpeer.consensus.messages import (
    AppendRequest,
    AppendResponse,
    RaftHeartbeat,
    RaftHeartbeatResponse,
    SnapshotRequest,
)
from dpeer.consensus.host import RaftHost
from dpeer.consensus.progress import ProgressState
from dpeer.consensus.ready import ReadState, Role
from dpeer.consensus.entry import Entry
from dpeer.consensus.errors import Compacted

log = logging.getLogger("dpeer.consensus.core")


# Busy beats an idle leader keeps sending after its last entry, commit or read. A commit
# reaches followers at once (the leader broadcasts the new commit index), and a follower
# that lacks entries keeps the leader busy anyway, so the busy beats after the last entry
# only hold the short lease a little longer. A training cluster appends a checkpoint entry
# every second or so; with election_timeout_max (6 beats) its leader never went idle.
IDLE_AFTER_BEATS = 2


class LeaderSide(RaftHost):
    """Leader-only behaviour of RaftNode."""

    # -- leader side ------------------------------------------------------------------------
    def _tick_leader(self, now: float) -> None:
        idle = self._idle()
        if now >= self._quorum_check_due:
            window = self.cfg.idle_election_timeout if idle else self.cfg.election_timeout_min
            self._quorum_check_due = now + window
            if not self.tracker.quorum_active(self.id):
                log.info("%s steps down in term %d: no quorum heard (check-quorum)", self.id,
                         self.term)
                self._become_follower(self.term, None)
                return
            for peer, pr in self.tracker.progress.items():
                pr.recent_active = peer == self.id
        if now >= self._heartbeat_due:
            beat, learner_beat = self._beat_intervals(idle)
            self._heartbeat_due = now + beat
            # The first idle beat goes to the learners too: it carries the commit index, which a
            # learner whose answer crossed the last commit's broadcast would otherwise learn
            # only at the next (slow) learner beat.
            going_idle, self._beat_idle = idle and not self._beat_idle, idle
            learners = now >= self._learner_heartbeat_due or going_idle
            if learners:
                self._learner_heartbeat_due = now + learner_beat
            self._retry_stale_snapshots(now)
            self._broadcast_heartbeat(learners, idle)

    def _beat_intervals(self, idle: bool) -> tuple[float, float]:
        """(voter, learner) heartbeat intervals, busy or idle."""
        if idle:
            return self.cfg.idle_heartbeat_interval, self.cfg.idle_learner_heartbeat_interval
        return self.cfg.heartbeat_interval, self.cfg.learner_heartbeat_interval

    def _idle(self) -> bool:
        """Nothing appended, committed or read for IDLE_AFTER_BEATS heartbeats, every voter
        holding the whole log: the leader may beat slowly (RaftConfig's idle settings)."""
        if not self.cfg.idle_heartbeat_interval or self._pending_reads:
            return False
        if self._now - self._active_at < IDLE_AFTER_BEATS * self.cfg.heartbeat_interval:
            return False
        last, voters = self.log.last_index(), self.membership.voters
        return all(pr.match >= last for peer, pr in self.tracker.progress.items() if peer in voters)

    def _mark_active(self) -> None:
        """Leave the idle period: busy beats from now on. The check-quorum window under way
        keeps its length (the busy one starts at the next check): pulling the check in would
        judge a window in which idle beats had no reason to be answered yet."""
        self._active_at = self._now
        self._heartbeat_due = min(self._heartbeat_due, self._now + self.cfg.heartbeat_interval)

    def recheck_quorum(self, now: float) -> None:
        """Judge the quorum on a fresh busy window: forget who answered, beat every voter now and
        step down at the window's end unless a quorum answers. A leader idle when a majority
        died would otherwise lead on for up to idle_election_timeout; live voters answer the
        beat at once, so a wrong verdict costs a busy beat or two."""
        self._now = now
        if self.role is not Role.LEADER:
            return
        for peer, pr in self.tracker.progress.items():
            pr.recent_active = peer == self.id
        self._mark_active()
        self._quorum_check_due = now + self.cfg.election_timeout_min
        self._heartbeat_due = now + self.cfg.heartbeat_interval
        self._broadcast_heartbeat(learners=False)

    def peer_alive(self, now: float, node: str) -> None:
        """The failure detector sees `node` alive again (restarted, or back from a partition):
        as leader, beat it now, so it learns the leader without waiting for an idle beat."""
        self._now = now
        pr = self.tracker.progress.get(node) if self.role is Role.LEADER else None
        if pr is not None and node != self.id:
            commit = min(pr.match, self.log.committed)
            self._send(node, RaftHeartbeat(self.term, self.id, commit, self._read_seq, self._idle()))

    def _retry_stale_snapshots(self, now: float) -> None:
        for pr in self.tracker.progress.values():
            stale = now - pr.snapshot_sent_at > self.cfg.election_timeout_max
            if pr.state is ProgressState.SNAPSHOT and stale:
                pr.pending_snapshot = 0
                pr.become_probe()

    def _leader_append(self, kind: str, payload: dict[str, Any]) -> Entry:
        entry = Entry(self.log.last_index() + 1, self.term, kind, payload)
        self._mark_active()
        self._append([entry])
        self._broadcast_append(allow_empty=False)
        return entry

    def _broadcast_append(self, allow_empty: bool = True) -> None:
        for peer in sorted(self.tracker.progress):
            if peer != self.id:
                self._send_append(peer, allow_empty)

    def _broadcast_heartbeat(self, learners: bool = True, idle: bool = False) -> None:
        """Beat every voter, and the learners too when learners is True; idle marks slow beats.
        An idle leader beats a learner that lacks entries with the voters, so its answer shows
        the gap at the voters' pace rather than the learners' slower one."""
        voters, last = self.membership.voters, self.log.last_index()
        for peer, pr in sorted(self.tracker.progress.items()):
            if peer != self.id and (learners or peer in voters or (idle and pr.match < last)):
                commit = min(pr.match, self.log.committed)
                self._send(peer, RaftHeartbeat(self.term, self.id, commit, self._read_seq, idle))

    def _send_append(self, peer: str, allow_empty: bool = True) -> bool:
        """Send the next entries (or a snapshot) to peer; False when nothing was sent."""
        pr = self.tracker.progress[peer]
        if pr.is_paused():
            return False
        prev = pr.next - 1
        prev_term = self.log.term(prev)
        hi = min(self.log.last_index() + 1, pr.next + self.cfg.max_entries_per_msg)
        try:
            entries = self.log.slice(pr.next, hi, self.cfg.max_bytes_per_msg) if pr.next < hi else []
        except Compacted:
            prev_term = None
        if prev_term is None:
            return self._send_snapshot(peer)
        if not entries and not allow_empty:
            return False
        self._send(peer, AppendRequest(self.term, self.id, prev, prev_term, tuple(entries),
                                       self.log.committed))
        if entries and pr.state is ProgressState.REPLICATE:
            pr.next = entries[-1].index + 1
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return True

    def _send_snapshot(self, peer: str) -> bool:
        snap = self.log.storage.snapshot()
        if snap.index == 0:
            return False
        conf = snap.membership
        self._send(peer, SnapshotRequest(self.term, self.id, snap.index, snap.term, snap.data,
                                         tuple(sorted(conf.voters)), tuple(sorted(conf.learners)), conf.uids,
                                         conf.epoch, conf.forced_at))
        self.tracker.progress[peer].become_snapshot(snap.index, self._now)
        return True

    def _on_append_response(self, src: str, m: AppendResponse) -> None:
        pr = self.tracker.progress.get(src)
        if pr is None:
            return
        pr.heard(self._now)
        if not m.success:
            probe_prev = m.reject_hint
            if m.reject_term > 0:
                probe_prev, _ = self.log.find_conflict_by_term(m.reject_hint, m.reject_term)
            if pr.maybe_decrease(m.match_index, probe_prev):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(src)
            return
        paused = pr.is_paused()
        if not pr.maybe_update(m.match_index) and pr.state is ProgressState.REPLICATE:
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match + 1 >= self.log.first_index():
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT:
            pr.become_probe()  # compacted past it again meanwhile: the next snapshot goes at once
        if self._maybe_commit():
            self._broadcast_append()
        sent = False
        while pr.next <= self.log.last_index() and self._send_append(src, allow_empty=False):
            sent = True
        if paused and not sent:
            # It was paused when the commit index last moved: tell it now (etcd does the same),
            # or a caught-up learner of an idle leader would wait for a slow beat to learn it.
            self._send_append(src)

    def _on_heartbeat_response(self, src: str, m: RaftHeartbeatResponse) -> None:
        pr = self.tracker.progress.get(src)
        if pr is None:
            return
        pr.heard(self._now)
        pr.probe_sent = False
        pr.read_ack = max(pr.read_ack, m.read_seq)
        if pr.match < self.log.last_index():
            self._send_append(src)
        self._check_reads()

    def _maybe_commit(self) -> bool:
        """Commit what a quorum of voters holds, if of this term; then settle reads/removal."""
        had_term_commit = self._committed_in_term()
        if not self.log.maybe_commit(self.tracker.committed_index(), self.term):
            return False
        self._mark_active()
        if not had_term_commit:
            for read in self._pending_reads:
                read[1] = self.log.committed if read[1] is None else read[1]
            self._check_reads()
        if self.id not in self.membership.voters and self._conf_history[-1][0] <= self.log.committed:
            log.info("%s steps down: removed from the voters", self.id)
            self._broadcast_append()
            self._become_follower(self.term, None)
            return False
        return True

    def _committed_in_term(self) -> bool:
        return self.log.term(self.log.committed) == self.term

    def _check_reads(self) -> None:
        while self._pending_reads:
            rid, index = self._pending_reads[0]
            if index is None or not self.tracker.read_confirmed(self.id, rid):
                return
            self._pending_reads.pop(0)
            self._read_states.append(ReadState(rid, index))
