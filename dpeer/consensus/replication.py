"""Leadership: what a RaftNode does while it leads: heartbeats, check-quorum, replication, commit.

It owns the leader's timers (the next voter and learner beats, the next check-quorum, when the
leader was last busy) and the index of the last configuration change it proposed; the leader's
view of each follower is RaftNode's Tracker, its reads RaftNode's ReadIndex.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from dpeer.consensus.messages import (
    AppendRequest,
    AppendResponse,
    RaftHeartbeat,
    RaftHeartbeatResponse,
    SnapshotRequest,
)
from dpeer.consensus.progress import ProgressState
from dpeer.consensus.ready import Refused, Role
from dpeer.consensus.entry import Entry, RaftKind
from dpeer.consensus.errors import Compacted

if TYPE_CHECKING:
    from dpeer.consensus.core import RaftNode

log = logging.getLogger("dpeer.consensus.core")


# Busy beats an idle leader keeps sending after its last entry, commit or read. A commit
# reaches followers at once (the leader broadcasts the new commit index), and a follower
# that lacks entries keeps the leader busy anyway, so the busy beats after the last entry
# only hold the short lease a little longer. A training cluster appends a checkpoint entry
# every second or so; with election_timeout_max (6 beats) its leader never went idle.
IDLE_AFTER_BEATS = 2



class Leadership:
    """The leader's side of a RaftNode. heartbeat_due, learner_heartbeat_due: the next beat of
    the voters and of the learners; quorum_check_due: the end of the check-quorum window;
    active_at: when the leader last appended, committed or read (idle beats follow);
    beat_idle: the last beat was idle; pending_conf_index: its last configuration change."""

    def __init__(self, node: RaftNode, now: float) -> None:
        self.node = node
        self.heartbeat_due = self.quorum_check_due = math.inf
        self.learner_heartbeat_due = -math.inf
        self.active_at = now
        self.beat_idle = False
        self.pending_conf_index = 0

    def next_deadline(self) -> float:
        """When the leader's next beat or check-quorum is due."""
        return min(self.heartbeat_due, self.quorum_check_due)

    def start(self) -> None:
        """Take up leadership just won: fresh progress, timers, and a no-op of the new term."""
        node, now = self.node, self.node.now
        tracker = node.tracker
        tracker.progress = {}
        tracker.reset(node.membership, node.log.last_index())
        for pr in tracker.progress.values():
            pr.recent_active = True  # a check-quorum window of grace; heard_at waits for a real answer
        if node.id in tracker.progress:
            tracker.progress[node.id].maybe_update(node.log.stable_index())
        self.heartbeat_due = now + node.cfg.heartbeat_interval
        self.learner_heartbeat_due = now + node.cfg.learner_heartbeat_interval
        self.quorum_check_due = now + node.cfg.election_timeout_min
        self.append(RaftKind.NOOP, {})
        self.pending_conf_index = node.log.last_index()

    def stop(self) -> None:
        """Leadership is over (or never was): no beats, no quorum checks."""
        self.heartbeat_due = self.quorum_check_due = math.inf

    # -- timers -------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Run check-quorum and the heartbeats that are due."""
        node = self.node
        cfg = node.cfg
        idle = self.idle()
        if now >= self.quorum_check_due:
            window = cfg.idle_election_timeout if idle else cfg.election_timeout_min
            self.quorum_check_due = now + window
            if not node.tracker.quorum_active(node.id):
                log.info("%s steps down in term %d: no quorum heard (check-quorum)", node.id,
                         node.term)
                node.election.follow(node.term, None)
                return
            for peer, pr in node.tracker.progress.items():
                pr.recent_active = peer == node.id
        if now >= self.heartbeat_due:
            beat, learner_beat = self.beat_intervals(idle)
            self.heartbeat_due = now + beat
            # The first idle beat goes to the learners too: it carries the commit index, which a
            # learner whose answer crossed the last commit's broadcast would otherwise learn
            # only at the next (slow) learner beat.
            going_idle, self.beat_idle = idle and not self.beat_idle, idle
            learners = now >= self.learner_heartbeat_due or going_idle
            if learners:
                self.learner_heartbeat_due = now + learner_beat
            self.retry_stale_snapshots(now)
            self.broadcast_heartbeat(learners, idle)

    def beat_intervals(self, idle: bool) -> tuple[float, float]:
        """(voter, learner) heartbeat intervals, busy or idle."""
        cfg = self.node.cfg
        if idle:
            return cfg.idle_heartbeat_interval, cfg.idle_learner_heartbeat_interval
        return cfg.heartbeat_interval, cfg.learner_heartbeat_interval

    def idle(self) -> bool:
        """Nothing appended, committed or read for IDLE_AFTER_BEATS heartbeats, every voter
        holding the whole log: the leader may beat slowly (RaftConfig's idle settings)."""
        node = self.node
        if not node.cfg.idle_heartbeat_interval or node.reads.pending:
            return False
        if node.now - self.active_at < IDLE_AFTER_BEATS * node.cfg.heartbeat_interval:
            return False
        last, voters = node.log.last_index(), node.membership.voters
        return all(pr.match >= last for peer, pr in node.tracker.progress.items() if peer in voters)

    def mark_active(self) -> None:
        """Leave the idle period: busy beats from now on. The check-quorum window under way
        keeps its length (the busy one starts at the next check): pulling the check in would
        judge a window in which idle beats had no reason to be answered yet."""
        now = self.node.now
        self.active_at = now
        self.heartbeat_due = min(self.heartbeat_due, now + self.node.cfg.heartbeat_interval)

    def recheck_quorum(self) -> None:
        """Judge the quorum on a fresh busy window: forget who answered, beat every voter now and
        step down at the window's end unless a quorum answers. A leader idle when a majority
        died would otherwise lead on for up to idle_election_timeout; live voters answer the
        beat at once, so a wrong verdict costs a busy beat or two."""
        node, now = self.node, self.node.now
        for peer, pr in node.tracker.progress.items():
            pr.recent_active = peer == node.id
        self.mark_active()
        self.quorum_check_due = now + node.cfg.election_timeout_min
        self.heartbeat_due = now + node.cfg.heartbeat_interval
        self.broadcast_heartbeat(learners=False)

    def beat(self, peer: str) -> None:
        """Beat one member now, if it is one (as peer_alive asks)."""
        node = self.node
        pr = node.tracker.progress.get(peer)
        if pr is not None and peer != node.id:
            commit = min(pr.match, node.log.committed)
            node.out.send(peer, RaftHeartbeat(node.term, node.id, commit, node.reads.seq, self.idle()))

    def retry_stale_snapshots(self, now: float) -> None:
        """Snapshots unacknowledged for election_timeout_max: probe those followers again."""
        for pr in self.node.tracker.progress.values():
            stale = now - pr.snapshot_sent_at > self.node.cfg.election_timeout_max
            if pr.state is ProgressState.SNAPSHOT and stale:
                pr.pending_snapshot = 0
                pr.become_probe()

    # -- replication ----------------------------------------------------------------------------
    def append(self, kind: str, payload: dict[str, Any]) -> Entry:
        """Append an entry of this term, follow the configuration it may hold, and send it."""
        node = self.node
        entry = Entry(node.log.last_index() + 1, node.term, kind, payload)
        self.mark_active()
        node.log.append([entry])
        before = node.membership
        node.confs.appended([entry])
        if node.membership != before:
            node.tracker.reset(node.membership, node.log.last_index())
        self.broadcast_append(allow_empty=False)
        return entry

    def broadcast_append(self, allow_empty: bool = True) -> None:
        """Send every follower what it lacks (the commit index too, when allow_empty)."""
        for peer in sorted(self.node.tracker.progress):
            if peer != self.node.id:
                self.send_append(peer, allow_empty)

    def broadcast_heartbeat(self, learners: bool = True, idle: bool = False) -> None:
        """Beat every voter, and the learners too when learners is True; idle marks slow beats.
        An idle leader beats a learner that lacks entries with the voters, so its answer shows
        the gap at the voters' pace rather than the learners' slower one."""
        node = self.node
        voters, last = node.membership.voters, node.log.last_index()
        for peer, pr in sorted(node.tracker.progress.items()):
            if peer != node.id and (learners or peer in voters or (idle and pr.match < last)):
                commit = min(pr.match, node.log.committed)
                node.out.send(peer, RaftHeartbeat(node.term, node.id, commit, node.reads.seq, idle))

    def send_append(self, peer: str, allow_empty: bool = True) -> bool:
        """Send the next entries (or a snapshot) to peer; False when nothing was sent."""
        node = self.node
        pr = node.tracker.progress[peer]
        if pr.is_paused():
            return False
        prev = pr.next - 1
        prev_term = node.log.term(prev)
        hi = min(node.log.last_index() + 1, pr.next + node.cfg.max_entries_per_msg)
        try:
            entries = node.log.slice(pr.next, hi, node.cfg.max_bytes_per_msg) if pr.next < hi else []
        except Compacted:
            prev_term = None
        if prev_term is None:
            return self.send_snapshot(peer)
        if not entries and not allow_empty:
            return False
        node.out.send(peer, AppendRequest(node.term, node.id, prev, prev_term, tuple(entries),
                                          node.log.committed))
        if entries and pr.state is ProgressState.REPLICATE:
            pr.next = entries[-1].index + 1
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return True

    def send_snapshot(self, peer: str) -> bool:
        """Send peer the stored snapshot (its log was compacted past what peer lacks)."""
        node = self.node
        snap = node.log.storage.snapshot()
        if snap.index == 0:
            return False
        conf = snap.membership
        node.out.send(peer, SnapshotRequest(node.term, node.id, snap.index, snap.term, snap.data,
                                            tuple(sorted(conf.voters)), tuple(sorted(conf.learners)), conf.uids,
                                            conf.epoch, conf.forced_at))
        node.tracker.progress[peer].become_snapshot(snap.index, node.now)
        return True

    def on_append_response(self, src: str, m: AppendResponse) -> None:
        """Move src's progress on its answer: back off on a rejection, commit and send more on
        an acknowledgement."""
        node = self.node
        pr = node.tracker.progress.get(src)
        if pr is None:
            return
        pr.heard(node.now)
        if not m.success:
            probe_prev = m.reject_hint
            if m.reject_term > 0:
                probe_prev, _ = node.log.find_conflict_by_term(m.reject_hint, m.reject_term)
            if pr.maybe_decrease(m.match_index, probe_prev):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self.send_append(src)
            return
        paused = pr.is_paused()
        if not pr.maybe_update(m.match_index) and pr.state is ProgressState.REPLICATE:
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match + 1 >= node.log.first_index():
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT:
            pr.become_probe()  # compacted past it again meanwhile: the next snapshot goes at once
        if self.maybe_commit():
            self.broadcast_append()
        sent = False
        while pr.next <= node.log.last_index() and self.send_append(src, allow_empty=False):
            sent = True
        if paused and not sent:
            # It was paused when the commit index last moved: tell it now (etcd does the same),
            # or a caught-up learner of an idle leader would wait for a slow beat to learn it.
            self.send_append(src)

    def on_heartbeat_response(self, src: str, m: RaftHeartbeatResponse) -> None:
        """src answered a beat: it is active, acknowledges reads, and gets what it lacks."""
        node = self.node
        pr = node.tracker.progress.get(src)
        if pr is None:
            return
        pr.heard(node.now)
        pr.probe_sent = False
        pr.read_ack = max(pr.read_ack, m.read_seq)
        if pr.match < node.log.last_index():
            self.send_append(src)
        node.reads.confirm(node.tracker, node.id)

    def maybe_commit(self) -> bool:
        """Commit what a quorum of voters holds, if of this term; then settle reads/removal."""
        node = self.node
        had_term_commit = self.committed_in_term()
        if not node.log.maybe_commit(node.tracker.committed_index(), node.term):
            return False
        self.mark_active()
        if not had_term_commit:
            node.reads.term_committed(node.log.committed)
            node.reads.confirm(node.tracker, node.id)
        if node.id not in node.membership.voters and node.confs.last_index <= node.log.committed:
            log.info("%s steps down: removed from the voters", node.id)
            self.broadcast_append()
            node.election.follow(node.term, None)
            return False
        return True

    def committed_in_term(self) -> bool:
        """The commit index holds an entry of the leader's term (reads may be served)."""
        return self.node.log.term(self.node.log.committed) == self.node.term

    # -- membership changes ---------------------------------------------------------------------
    def removal_refusal(self, node: str) -> Refused | None:
        """On the leader: refuse removing a voter when the voters that remain hold no live quorum
        (etcd's strict reconfiguration check): with another voter down or replaced, the removal
        would commit and leave a configuration that can never commit again."""
        me, now = self.node, self.node.now
        remaining = [v for v in me.membership.voters if v != node]
        if me.role is not Role.LEADER or node not in me.membership.voters or not remaining:
            return None  # not the leader: the proposal that follows says so; no voter left: nothing to judge
        # two of the slowest beats a live voter answers (idle beats are the slowest)
        since = now - 2 * max(me.cfg.election_timeout_max, me.cfg.idle_heartbeat_interval)
        live = me.tracker.live(remaining, me.id, since)
        if len(live) > len(remaining) // 2:
            return None
        silent = sorted(set(remaining) - set(live))
        return Refused(f"removing voter {node!r} would leave voters {sorted(remaining)}, of which {silent} have not "
                       f"answered for {now - since:.1f}s: no live quorum; bring them back or replace them first")
