"""The invariants the simulation checks after every event, and at the end of a run.

Safety, at every check: one leader per (epoch, term); every two boxes agree on every committed
index; one view (members, sites, shares) per generation, its shares valid; a worker is handed only committed views; no two
groups step in one tick, except an older group on boxes that have not learned of the newer view
(they know no leader, so their fence is due, or no newer view reached them yet: the window a view
change leaves open, which the house found; see the report of issue 18); a box that has known no leader past its fence time does not train;
reads are linearizable (per key, one writer at a time: a read returns a value whose write began
before the read ended, and, when that write was acknowledged, no older than the newest write
acknowledged before the read began or a read that ended before it began; a write without an
answer may take effect late); no handler or task raised. At the end, after
the faults healed: acknowledged writes are in the committed state, a leader is known, and the
newest view's group trains.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from dpeer.consensus import Role
from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.statemachine.state import ClusterState, apply
from dpeer.view import valid_shares

from tests.house.cluster import House

FENCE_SLACK = 1.0


class Violation(AssertionError):
    """An invariant failed; the message names it."""


@dataclass
class Op:
    """One kv operation as the operator saw it: invoked, and (when it returned) its result."""

    kind: str  # put or get
    key: str
    value: int | None
    start: float
    end: float | None = None
    ok: bool = False


@dataclass
class Checker:
    """Keeps what earlier checks saw (committed entries by index, leaders by term)."""

    house: House
    committed: dict[int, tuple[int, str, str]] = field(default_factory=dict)
    seen_to: dict[str, tuple[int, int]] = field(default_factory=dict)  # box -> (life, index checked)
    leaders: dict[tuple[int, int], str] = field(default_factory=dict)
    views: dict[int, tuple] = field(default_factory=dict)  # the views the state machine took: (members, sites, shares)
    state: ClusterState = field(default_factory=ClusterState)  # the committed log applied, as a box does
    unapplied: dict[int, Entry] = field(default_factory=dict)  # committed entries seen, not yet applied
    ticks_seen: int = 0  # data-plane ticks judged so far (each once, at the next check)
    leaderless: dict[str, float] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    checks: int = 0
    founding: str | None = None  # the cluster's first entry: a box whose log starts otherwise is another cluster

    def outsider(self, nid: str) -> bool:
        """Whether nid (now) belongs to another cluster: explicitly a stranger, or its log starts
        with another founding entry (a box that founded its own cluster)."""
        box = self.house.boxes[nid]
        if nid in self.house.strangers:
            return True
        if box.daemon is None:
            return False
        store = box.daemon.store
        if store.first_index > 1 or store.last_index < 1:
            return False
        first = store.entries(1, 2)[0]
        mine = json.dumps([first.term, first.kind.value, first.payload], sort_keys=True, default=str)
        if self.founding is None:
            self.founding = mine
        return mine != self.founding

    def members(self) -> list[str]:
        """Boxes up, not paused, and of this cluster."""
        return [n for n in self.house.up() if not self.outsider(n)]

    def check(self) -> None:
        """Every safety invariant, now."""
        self.checks += 1
        h = self.house
        errors = h.net.crashes + h.loop.errors
        if errors:
            raise Violation(f"a handler or task raised: {errors[0]}")
        now = h.loop.time()
        for nid, box in h.boxes.items():
            if box.daemon is None or self.outsider(nid):
                continue
            node = box.daemon.node
            if node.role is Role.LEADER:
                key = (node.raft.epoch, node.store.current_term)
                other = self.leaders.setdefault(key, nid)
                if other != nid:
                    raise Violation(f"two leaders in epoch {key[0]} term {key[1]}: {other} and {nid}")
            self._committed(nid, box)
            self._fenced(nid, box, now)
        self._handed()
        ticks, self.ticks_seen = h.training.stepped[self.ticks_seen:], len(h.training.stepped)
        for at, gens in ticks:
            older = [g for g in gens if g != max(gens)]
            if older and not all(self._fencing(g, max(gens)) for g in older):
                raise Violation(f"two groups trained at once at t={at:.3f}: generations {list(gens)}")

    def _fencing(self, gen: int, newest: int) -> bool:
        """Whether every box still training in the older `gen` has not learned of `newest` yet:
        it knows no leader (its fence is due) or no view newer than its own reached it. That is
        the window a view change leaves open (bounded by the minority check in _fenced); a box
        that was handed the newer view and trains on in the old one is a violation."""
        boxes = [n for n, w in self.house.training.workers.items() if w.alive and w.gen == gen]
        return bool(boxes) and all(n in self.leaderless or self.house.boxes[n].worker.given_generation < newest
                                   for n in boxes)

    def _committed(self, nid: str, box) -> None:
        store = box.daemon.store
        life, upto = self.seen_to.get(nid, (box.lives, 0))
        if life != box.lives:
            upto = 0
        lo = max(upto + 1, store.first_index)
        hi = store.commit_index
        if hi >= lo:
            for e in store.entries(lo, hi + 1):
                mine = (e.term, e.kind.value, json.dumps(e.payload, sort_keys=True, default=str))
                new = e.index not in self.committed
                first = self.committed.setdefault(e.index, mine)
                if first != mine:
                    raise Violation(f"{nid} committed {mine} at index {e.index}, another box {first}")
                if new:
                    self.unapplied[e.index] = e
        self.seen_to[nid] = (box.lives, max(upto, hi))
        self._apply_committed()

    def _apply_committed(self) -> None:
        """Apply the committed entries in index order, as every box does: a view counts once the
        state machine takes it (a view committed after one of its members was declared dead is
        refused, and the next view takes its generation)."""
        while self.state.applied_index + 1 in self.unapplied:
            e = self.unapplied.pop(self.state.applied_index + 1)
            self.state, result = apply(self.state, e)
            if result.accepted and e.kind is EntryKind.VIEW:
                view = self.state.view
                gen, members = view.generation, (view.members, view.sites, view.shares)
                if not valid_shares(view.shares, len(view.members)):
                    raise Violation(f"generation {gen} commits shares {view.shares} for members {view.members}")
                if self.views.setdefault(gen, members) != members:
                    raise Violation(f"two views of generation {gen}: {self.views[gen]} and {members}")

    def _handed(self, final: bool = False) -> None:
        """Each view handed to a worker must be a committed one. The box that handed it may go
        down before any check read its log, and the others may not know yet that it committed:
        a view no check has seen committed stays pending until one does (or the run ends)."""
        pending = []
        for nid, gen, members in self.house.training.handed:
            if self.outsider(nid):  # another cluster's view (a wiped founder founded again): its own numbering
                continue
            committed = self.views.get(gen)
            if committed is None and not final:
                pending.append((nid, gen, members))
            elif committed != members:
                raise Violation(f"{nid}'s worker was handed generation {gen} {members}, committed: {committed}")
        self.house.training.handed[:] = pending

    def _fenced(self, nid: str, box, now: float) -> None:
        daemon = box.daemon
        if daemon.node.leader_id is not None or box.paused:
            self.leaderless.pop(nid, None)
            return
        since = self.leaderless.setdefault(nid, now)
        view = daemon.store.state.view
        if view is not None and nid in view.members and now - since > daemon.link.fence_after + FENCE_SLACK \
                and box.worker.alive and box.worker.formed:
            raise Violation(f"{nid} has known no leader for {now - since:.1f}s (fence after "
                            f"{daemon.link.fence_after:.1f}s) and its worker still trains: a minority keeps training")

    # -- kv history ----------------------------------------------------------------------------
    def read_done(self, op: Op) -> None:
        """Judge a read that returned against the writes and reads before it."""
        writes = [o for o in self.ops if o.kind == "put" and o.key == op.key]
        began = {o.value for o in writes if o.start <= (op.end or 0)}
        if op.value is not None and op.value not in began:
            raise Violation(f"read of {op.key} returned {op.value}, which no write had begun")
        floor = max([o.value for o in writes if o.ok and o.end is not None and o.end < op.start] +
                    [o.value for o in self.ops if o.kind == "get" and o.ok and o.key == op.key
                     and o.end is not None and o.end < op.start and o.value is not None], default=None)
        # a write whose caller got no answer (a timeout, a lost reply, a retried forward) may take
        # effect at any time after it began, so returning its value is never stale by itself
        acked = {o.value for o in writes if o.ok}
        if floor is not None and (op.value is None or (op.value < floor and op.value in acked)):
            raise Violation(f"stale read of {op.key}: {op.value} after {floor} was acknowledged or read")

    def leader_known(self) -> bool:
        """Whether some box of this cluster knows a leader now."""
        return any(self.house.boxes[n].daemon.node.leader_id is not None for n in self.members())

    def missing_write(self) -> str | None:
        """What breaks the acknowledged writes, or None: one absent from the committed log, one
        committed before a write that was acknowledged before it began, or the most advanced
        box's applied value of a key other than the last committed write of it. A write whose
        caller got no answer may commit at any time after it began, even after a later
        acknowledged one (seed 162: k2=8 timed out, then committed after k2=9)."""
        h = self.house
        up = self.members()
        if not up:
            return None
        best = max(up, key=lambda n: h.boxes[n].daemon.store.last_applied)
        store = h.boxes[best].daemon.store
        where: dict[tuple[str, int], list[int]] = {}
        last: dict[str, tuple[int, int]] = {}
        for index in sorted(self.committed):
            _, kind, payload = self.committed[index]
            if kind == EntryKind.KV_PUT.value:
                put = json.loads(payload)
                where.setdefault((put["key"], int(put["value"])), []).append(index)
                if index <= store.last_applied:
                    last[put["key"]] = (index, int(put["value"]))
            elif kind == EntryKind.KV_DELETE.value and index <= store.last_applied:
                last[json.loads(payload)["key"]] = (index, None)
        acked = [o for o in self.ops if o.kind == "put" and o.ok]
        for op in acked:
            at = where.get((op.key, op.value))
            if not at:
                return f"acknowledged write {op.key}={op.value} is missing from the committed log"
            if min(at) > store.last_applied:
                return f"{best} has not yet applied acknowledged write {op.key}={op.value} (index {min(at)})"
            later = [a for a in acked if a.key == op.key and a.end is not None and a.end < op.start
                     and max(where.get((a.key, a.value), [0])) > min(at)]
            if later:
                return (f"acknowledged write {op.key}={op.value} (index {min(at)}) was overwritten by "
                        f"{later[0].value}, acknowledged before it began")
        for key, (index, value) in last.items():
            have = store.state.kv.get(key)
            if (None if have is None else int(have)) != value:
                return f"{best} applied {key}={have}, the last committed write of it is {value} (index {index})"
        return None

    def final(self) -> None:
        """After the faults healed and the cluster settled: acknowledged writes, a leader, training."""
        self.check()
        self._handed(final=True)
        h = self.house
        up = self.members()
        leaders = [n for n in up if h.boxes[n].daemon.node.leader_id is not None]
        if not leaders:
            raise Violation("no box knows a leader after the faults healed")
        missing = self.missing_write()
        if missing:
            raise Violation(missing)


def trains(house: House, checker: Checker, since: float) -> str:
    """Why the newest committed view's group has not stepped since `since` ('' when it has)."""
    up = checker.members()
    view = max((house.boxes[n].daemon.store.state.view for n in up if house.boxes[n].daemon.store.state.view),
               key=lambda v: v.generation, default=None)
    if view is None:
        return "no view was ever committed"
    if any(at >= since and view.generation in gens for at, gens in house.training.stepped):
        return ""
    stuck = {n: house.boxes[n].worker.status() for n in view.members if n in house.boxes}
    return f"generation {view.generation} {list(view.members)} has not trained since t={since:.1f}: {stuck}"
