"""The simulated-Raft harness on dpeer.sim's Simulator: dpeer's RaftActors on raft_net's Disks
under seeded chaos, checked by raft_checker.Checker at every persisted Ready, for the schedules
of raft_schedules.py (raft_net.RaftNet runs nodes on the same Disks by hand, step by step).

Beyond crashes, restarts, partitions, loss and pauses, a node can be wiped (restarted on a new
disk under its old node id: a new store uid, only the founding configuration) and force can be
sent to any node; the cluster plays the daemon's leader chores that replace a member whose disk
was replaced (remove the old identity, add the new one as a learner, promote it).
"""

from __future__ import annotations

import random
from typing import Any

from raft_checker import Checker
from raft_net import Disks

from dpeer.consensus import LAN, RaftConfig, Role
from dpeer.consensus.ready import ProposeResult
from dpeer.consensus.sim_adapter import RaftActor
from dpeer.sim.network import LinkPolicy, SimNetwork
from dpeer.sim.simulator import Simulator
from dpeer.statemachine.entry import EntryKind


DETECT_EVERY = 0.05  # how often the failure-detector model looks
DETECT_AFTER = 0.25  # gossip's SIGKILL-to-dead time on loopback (BENCHMARKS.md "Membership")
CHORES_EVERY = 0.05  # how often the leader-chores model looks (the daemon's: 20 ms)


class RaftCluster:
    """n bootstrapped voters on a Simulator, driven by a seeded chaos schedule.

    With detector=True a failure-detector model stands in for gossip: a node whose leader (or,
    as leader, one of its voters) has been crashed, paused or cut off from it (either way) for
    DETECT_AFTER is told leader_lost, as the daemon does when gossip declares a member dead.
    """

    def __init__(self, seed: int, n: int, cfg: RaftConfig = LAN, compact_every: int = 0,
                 detector: bool = True, chores: bool = True) -> None:
        self.rng = random.Random(seed)
        self.cfg, self.compact_every = cfg, compact_every
        policy = LinkPolicy(delay_min=0.0005, delay_max=0.005)
        self.sim = Simulator(seed, SimNetwork(random.Random(seed ^ 0x5EED), policy))
        self.ids = [f"n{i}" for i in range(n)]
        self.checker = Checker(n // 2 + 1)
        self.proposed = self.wiped = 0
        self.calm = False
        self.forces: list[tuple[float, str, list[str], ProposeResult]] = []
        self.disks = Disks(self.ids, [], {nid: self._new_uid() for nid in self.ids})
        self.storages = self.disks.storages
        for nid in self.ids:
            self.disks.new(nid, self.disks.founding[nid])
            self.sim.add(nid, self._actor(nid))
        self._cut_since: dict[tuple[str, str], float] = {}
        if detector:
            self.sim.at(DETECT_EVERY, self._detect)
        if chores:
            self.sim.at(CHORES_EVERY, self._chores)

    def _new_uid(self) -> str:
        return "%032x" % self.rng.getrandbits(128)

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
        if node.role is Role.LEADER:
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
                           "resume", "wipe", "force"])
        if action == "wipe":
            nid = r.choice(self.ids)
            if self.can_wipe(nid):
                self.wipe(nid)
        elif action == "force" and sim.live():
            nid = r.choice(sim.live())
            voters = sorted(self.actor(nid).node.membership.voters)
            self.force(nid, [nid] + r.sample(voters, r.randint(0, len(voters))))
        elif action == "crash" and sim.live():
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

    def wipe(self, nid: str) -> None:
        """Restart nid on a new disk under the same node id (the old store is gone)."""
        if self.sim.nodes[nid].up:
            self.sim.crash(nid)
        self.checker.forget(nid)
        self.disks.new(nid, self._new_uid())
        self.wiped += 1
        self.sim.restart(nid, self._actor(nid))

    def intact_voters(self, conf_of: str, without: str = "") -> set[str]:
        """Voters of node conf_of's configuration whose store is still the one it names."""
        return self.disks.intact_voters(self.actor(conf_of).node.membership, without)

    def can_wipe(self, nid: str) -> bool:
        """Wiping nid leaves every configuration in force somewhere a quorum of intact voters,
        so the cluster can still elect a leader (the schedules check liveness at the end)."""
        return all(len(self.intact_voters(n, nid)) >= self.actor(n).node.membership.quorum for n in self.ids)

    def connected(self, a: str, b: str) -> bool:
        """Ground truth: a and b are up, running and can talk both ways."""
        net, live = self.sim.network, self.sim.live()
        return a in live and b in live and not net.is_blocked(a, b) and not net.is_blocked(b, a)

    def force(self, nid: str, voters: list[str]) -> ProposeResult:
        """An operator runs `dpeer force` at nid; its failure detector holds alive the voters it
        is connected to, under the store uid the configuration names."""
        node = self.actor(nid).node
        conf = node.membership
        alive = {v for v in conf.voters if self.connected(nid, v) and self.storages[v].uid == conf.uid_of(v)}
        res = node.force_new_configuration(self.sim.now, sorted(set(voters)), alive, 1.7e9 + self.sim.now)
        self.forces.append((self.sim.now, nid, sorted(set(voters)), res))
        self._emit(nid)
        return res

    def _chores(self) -> None:
        """The daemon's leader chores, gossip and join as the cluster plays them: the leader
        removes a member the configuration names with an old store uid, adds a node it lacks
        (back on a new disk) as a learner with its store's uid, and promotes learners back up
        to the founding voter count. One change at a time; a refused one is retried later."""
        nid = self.leader()
        if nid is not None:
            node = self.actor(nid).node
            change = self._next_change(node.membership)
            if change is not None:
                node.change_membership(*change)
                self._emit(nid)
        self.sim.at(self.sim.now + CHORES_EVERY, self._chores)

    def _next_change(self, conf: Any) -> tuple[str, str, str] | None:
        for n in sorted(conf.members):
            if self.storages[n].uid != conf.uid_of(n) and conf.voters != {n}:
                return ("remove", n, "")
        for n in self.ids:
            if n not in conf.members and self.sim.nodes[n].up:
                return ("add_learner", n, self.storages[n].uid)
        if conf.learners and len(conf.voters) < min(len(self.ids), self.cfg.max_voters):
            return ("promote", sorted(conf.learners)[0], "")
        return None

    def partition(self, side: set[str]) -> None:
        """Cut side from the rest; after in-flight messages land, watch the minority side."""
        rest = {n for n in self.ids if n not in side}
        self.heal()
        self.sim.network.partition(sorted(side), sorted(rest))
        self.sim.at(self.sim.now + 0.02, lambda: self._watch(side, rest))

    def _watch(self, side: set[str], rest: set[str]) -> None:
        """Watch one side when the other holds a quorum of the voters of every configuration in
        force anywhere (after wipes and replacements the voters are not all the nodes): the
        watched side cannot commit, even after one configuration change of its own. When
        neither side holds such a quorum, a change on one side can make it a majority."""
        if not self.sim.network.partitioned:
            return
        confs = [self.actor(n).node.membership for n in self.ids]
        minority = next((m for m, other in ((side, rest), (rest, side))
                         if all(len(other & c.voters) >= c.quorum for c in confs)), None)
        if minority is None:
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
