"""Seeded chaos schedules for the Raft core on dpeer.sim, with invariants checked after each event.

run_schedule(seed, n) reproduces one run exactly; a violation raises AssertionError naming it.
"""

from __future__ import annotations

import random
from typing import Any

from dpeer.peer.consensus import LAN, MemoryStorage, RaftConfig, RaftNode, Ready, Role, bootstrap
from dpeer.peer.consensus.sim_adapter import RaftActor
from dpeer.sim.network import LinkPolicy, SimNetwork
from dpeer.sim.simulator import Simulator
from dpeer.statemachine.entry import Entry, EntryKind


def _key(e: Entry) -> tuple[int, str, Any]:
    return (e.term, e.kind.value, e.payload)


class Checker:
    """Safety invariants, fed by every persisted Ready and every applied entry."""

    def __init__(self, quorum: int) -> None:
        self.quorum = quorum
        self.leaders: dict[int, str] = {}
        self.committed: dict[int, tuple[int, str, Any]] = {}
        self.commit_term: dict[int, int] = {}  # an upper bound of the term each index committed in
        self.applied: dict[int, tuple[int, str, Any]] = {}
        self.views: dict[int, Any] = {}
        self.seen_commit: dict[str, int] = {}
        self.minority: set[str] = set()
        self.minority_cap = 0
        self.outside: dict[int, set[int]] = {}  # (index -> terms) stored outside the minority

    def on_ready(self, nid: str, node: RaftNode, rd: Ready) -> None:
        if node.role is Role.LEADER and self.leaders.setdefault(node.term, nid) != nid:
            raise AssertionError(f"two leaders in term {node.term}: {self.leaders[node.term]}, {nid}")
        if rd.soft_state is not None and node.role is Role.LEADER:
            self._check_leader_completeness(nid, node)
        self._check_commits(nid, node)

    def _check_leader_completeness(self, nid: str, node: RaftNode) -> None:
        for i, (term, _, _) in self.committed.items():
            late = self.commit_term[i] < node.term  # leader completeness covers only these
            if late and i >= node.log.first_index() and node.log.term(i) != term:
                raise AssertionError(f"new leader {nid} (term {node.term}) lacks committed {i}")

    def _check_commits(self, nid: str, node: RaftNode) -> None:
        commit, prev = node.commit_index, self.seen_commit.get(nid, 0)
        lo = max(prev + 1, node.log.first_index())
        for e in node.log.slice(lo, commit + 1, 1 << 62) if lo <= commit else []:
            if nid in self.minority and e.index > self.minority_cap and \
                    e.term not in self.outside.get(e.index, ()):
                raise AssertionError(f"{nid} on the minority side committed new entry {e}")
            self.commit_term.setdefault(e.index, node.term)
            if self.committed.setdefault(e.index, _key(e)) != _key(e):
                raise AssertionError(f"{nid} committed {e} but {self.committed[e.index]} was committed")
        self.seen_commit[nid] = max(prev, commit)

    def on_apply(self, nid: str, entry: Entry, effective_view: bool) -> None:
        if self.applied.setdefault(entry.index, _key(entry)) != _key(entry):
            raise AssertionError(f"{nid} applied {entry}, others applied {self.applied[entry.index]}")
        if effective_view:
            gen, members = entry.payload["generation"], entry.payload["members"]
            if self.views.setdefault(gen, members) != members:
                raise AssertionError(f"two views with generation {gen}: {self.views[gen]}, {members}")


DETECT_EVERY = 0.05  # how often the failure-detector model looks
DETECT_AFTER = 0.25  # gossip's SIGKILL-to-dead time on loopback (BENCHMARKS.md "Membership")


class Cluster:
    """n bootstrapped voters on a Simulator, driven by a seeded chaos schedule.

    With detector=True a failure-detector model stands in for gossip: a node whose leader (or,
    as leader, one of its voters) has been crashed, paused or cut off from it (either way) for
    DETECT_AFTER is told leader_lost, as the daemon does when gossip declares a member dead.
    """

    def __init__(self, seed: int, n: int, cfg: RaftConfig = LAN, compact_every: int = 0,
                 detector: bool = True) -> None:
        self.rng = random.Random(seed)
        self.cfg, self.compact_every = cfg, compact_every
        policy = LinkPolicy(delay_min=0.0005, delay_max=0.005)
        self.sim = Simulator(seed, SimNetwork(random.Random(seed ^ 0x5EED), policy))
        self.ids = [f"n{i}" for i in range(n)]
        self.checker = Checker(n // 2 + 1)
        self.storages: dict[str, MemoryStorage] = {}
        self.proposed = 0
        self.calm = False
        self.uids = {nid: "%032x" % self.rng.getrandbits(128) for nid in self.ids}
        for nid in self.ids:
            self.storages[nid] = MemoryStorage(self.uids[nid])
            bootstrap(self.storages[nid], self.ids, uids=self.uids)
            self.sim.add(nid, self._actor(nid))
        self._cut_since: dict[tuple[str, str], float] = {}
        if detector:
            self.sim.at(DETECT_EVERY, self._detect)

    def _actor(self, nid: str) -> RaftActor:
        return RaftActor(nid, self.storages[nid], self.cfg, random.Random(self.rng.random()),
                         self.sim.now, self.checker, self.compact_every)

    def actor(self, nid: str) -> RaftActor:
        return self.sim.actor(nid)

    def leader(self) -> str | None:
        """The live node that leads in the highest term, if any."""
        live = [n for n in self.sim.live() if self.actor(n).node.role is Role.LEADER]
        return max(live, key=lambda n: self.actor(n).node.term, default=None)

    def propose(self, payload_kind: str = "kv") -> Any:
        """Propose through the current leader (as a client retrying on NotLeader would)."""
        nid = self.leader()
        if nid is None:
            return None
        act = self.actor(nid)
        self.proposed += 1
        if payload_kind == "view":
            gen = act.state["view"] + 1
            members = sorted(self.rng.sample(self.ids, self.rng.randint(1, len(self.ids))))
            res = act.node.propose(EntryKind.VIEW, {"generation": gen, "members": members,
                                                    "store_host": nid})
        else:
            res = act.node.propose(EntryKind.KV_PUT, {"key": f"k{self.proposed}", "value": nid})
        self._emit(nid)
        return res

    def _emit(self, nid: str) -> None:
        # The simulator has no public hook to send from outside an event; see the report.
        self.sim.emit(nid, self.actor(nid).drain())

    def _detect(self) -> None:
        """One look of the failure-detector model: a follower is told once of its lost leader,
        a leader once of each lost voter (the daemon tells Raft of every member gossip buries)."""
        sim, net = self.sim, self.sim.network
        for nid in sim.live():
            node = self.actor(nid).node
            for other in self._watched(nid):
                key = (nid, other)
                if other in sim.live() and not net.is_blocked(nid, other) and not net.is_blocked(other, nid):
                    self._cut_since.pop(key, None)
                    continue
                since = self._cut_since.setdefault(key, sim.now)
                if sim.now - since >= DETECT_AFTER:
                    node.leader_lost(sim.now, other)
                    self._cut_since[key] = float("inf")
                    sim.emit(nid, self.actor(nid).drain())
        sim.at(sim.now + DETECT_EVERY, self._detect)

    def _watched(self, nid: str) -> list[str]:
        node = self.actor(nid).node
        if node.role.value == "leader":
            return [v for v in sorted(node.membership.voters) if v != nid]
        return [] if node.leader in (None, nid) else [node.leader]

    # -- faults -----------------------------------------------------------------------------
    def chaos(self) -> None:
        """One random fault, chosen by the seeded RNG."""
        r, sim, net = self.rng, self.sim, self.sim.network
        if self.calm:
            return
        down = [n for n, s in sim.nodes.items() if not s.up]
        paused = [n for n, s in sim.nodes.items() if s.up and s.paused]
        action = r.choice(["crash", "restart", "partition", "one_way", "heal", "loss", "pause",
                           "resume"])
        if action == "crash" and sim.live():
            sim.crash(r.choice(sim.live()))
        elif action == "restart" and down:
            nid = r.choice(down)
            sim.restart(nid, self._actor(nid))
        elif action == "partition":
            self.partition(set(r.sample(self.ids, r.randint(1, len(self.ids) - 1))))
        elif action == "one_way":
            nid = r.choice(self.ids)
            net.partition([nid], [n for n in self.ids if n != nid], one_way=True)
        elif action == "heal":
            self.heal()
        elif action == "loss":
            net.set_loss(r.choice([0.0, 0.05, 0.2]))
        elif action == "pause" and sim.live():
            sim.pause(r.choice(sim.live()))
        elif action == "resume" and paused:
            sim.resume(r.choice(paused))

    def partition(self, side: set[str]) -> None:
        """Cut side from the rest; after in-flight messages land, watch the minority side."""
        rest = [n for n in self.ids if n not in side]
        self.heal()
        self.sim.network.partition(sorted(side), rest)
        minority = side if len(side) < self.checker.quorum else set(rest)
        if len(minority) < self.checker.quorum:
            self.sim.at(self.sim.now + 0.02, lambda: self._watch(minority))

    def _watch(self, minority: set[str]) -> None:
        if not self.sim.network.partitioned:
            return
        best = max(self.checker.seen_commit.values(), default=0)
        outside: dict[int, set[int]] = {}
        for nid, st in self.storages.items():
            for i in range(best + 1, st.last_index + 1) if nid not in minority else ():
                outside.setdefault(i, set()).add(st.term_at(i))
        self.checker.minority_cap, self.checker.outside = best, outside
        self.checker.minority = set(minority)

    def heal(self) -> None:
        self.sim.network.heal()
        self.checker.minority = set()

    def recover(self) -> None:
        """End the chaos: heal, no loss, every node up and running."""
        self.calm = True
        self.heal()
        self.sim.network.set_loss(0.0)
        for nid, slot in self.sim.nodes.items():
            if not slot.up:
                self.sim.restart(nid, self._actor(nid))
            elif slot.paused:
                self.sim.resume(nid)


def run_schedule(seed: int, n: int, chaos_s: float = 2.0, quiet_s: float = 2.0) -> Cluster:
    """Chaos with client proposals, then recovery; asserts safety throughout and liveness after."""
    c = Cluster(seed, n, compact_every=random.Random(seed).choice([0, 0, 8]))
    t = 0.0
    while t < chaos_s:
        t += c.rng.uniform(0.02, 0.08)
        kind = "view" if c.rng.random() < 0.3 else "kv"
        c.sim.at(t, lambda k=kind: c.propose(k))
        if c.rng.random() < 0.25:
            c.sim.at(t + 0.001, c.chaos)
    c.sim.run_until(chaos_s)
    c.recover()
    c.sim.run_for(quiet_s)
    leader = c.leader()
    assert leader is not None, f"seed {seed}: no leader {quiet_s}s after healing"
    res = c.propose("kv")
    c.sim.run_for(1.0)
    for nid in c.ids:
        node = c.actor(nid).node
        assert node.commit_index >= res.index, f"seed {seed}: {nid} did not commit {res.index}"
    return c


def election_times(trials: int, n: int = 5, cfg: RaftConfig = LAN, seed: int = 0,
                   detector: bool = True) -> list[float]:
    """Seconds from a leader crash to the next leader, over seeded trials (the crash comes
    2-3 s after start, when an idle-capable leader has gone idle)."""
    out = []
    for k in range(trials):
        c = Cluster(seed * 100_003 + k, n, cfg, detector=detector)
        c.sim.run_for(2.0 + c.rng.random())
        old = c.leader()
        assert old is not None
        term = c.actor(old).node.term
        c.sim.crash(old)
        t0 = c.sim.now
        while c.leader() is None or c.actor(c.leader()).node.term <= term:
            c.sim.run_for(0.001)
        out.append(c.sim.now - t0)
    return out
