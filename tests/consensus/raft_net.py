"""The simulated-Raft harness, driven by hand: Raft nodes on disks that carry store uids, and a
wire on which nothing moves unless told to, for step-by-step tests. raft_sim.RaftCluster runs
nodes on the same disks (Disks), checked the same way (raft_checker.Checker at every persisted
Ready), on dpeer.sim's Simulator under seeded chaos instead.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from raft_checker import Checker

from dpeer.consensus import MemoryStorage, Peer, RaftConfig, RaftNode, Ready, Role, bootstrap
from dpeer.consensus.ready import drive, persist
from dpeer.consensus.voting import VotingConfig
from dpeer.statemachine.entry import Entry, EntryKind

CFG = RaftConfig(heartbeat_interval=0.1, election_timeout_min=1.0, election_timeout_max=2.0)


def kv(i: int) -> dict[str, Any]:
    """A kv_put payload numbered i."""
    return {"key": f"k{i}", "value": str(i)}


def entry(index: int, term: int, kind: EntryKind = EntryKind.NOOP, **payload: Any) -> Entry:
    """A log entry for hand-built logs."""
    return Entry(index, term, kind, dict(payload))


def uid_for(nid: str, disk: int = 0) -> str:
    """A deterministic store uid for node nid's disk number `disk` (a wipe gives it a new disk)."""
    return "%032x" % random.Random(f"{nid}/{disk}").getrandbits(128)


class Disks:
    """Each node's current disk, a MemoryStorage under its store uid, and the founding
    configuration a box's own config names: what a new disk holds (a joiner's holds nothing)."""

    def __init__(self, voters: list[str], learners: list[str], uids: dict[str, str]) -> None:
        self.voters, self.learners, self.founding = voters, learners, uids
        self.storages: dict[str, MemoryStorage] = {}

    def new(self, nid: str, uid: str, founded: bool = True) -> MemoryStorage:
        """Give nid a new disk under uid (founded: holding the founding configuration)."""
        st = MemoryStorage(uid)
        if founded:
            bootstrap(st, self.voters, self.learners, uids=self.founding)
        self.storages[nid] = st
        return st

    def intact_voters(self, conf: VotingConfig, without: str = "") -> set[str]:
        """Voters of conf whose store is still the one it names."""
        return {v for v in conf.voters if v != without and self.storages[v].uid == conf.uid_of(v)}


class RaftNet:
    """Nodes over Disks whose messages queue until deliver() and may be cut or filtered; a
    Checker checks Raft's invariants at every persisted Ready and applied entry."""

    def __init__(self, ids: list[str], voters: list[str] | None = None,
                 learners: list[str] = (), joiners: list[str] = (), cfg: RaftConfig = CFG) -> None:
        self.now, self.cfg = 0.0, cfg
        self.disks = Disks(list(voters or ids), list(learners), {n: uid_for(n) for n in ids})
        self.storages = self.disks.storages
        self.checker = Checker(len(self.disks.voters) // 2 + 1)
        self.nodes: dict[str, RaftNode] = {}
        self.applied: dict[str, list[Entry]] = {}
        self.readies: dict[str, list[Ready]] = {}
        self.queue: list[tuple[Peer, str, str, Any]] = []  # (sender, dst, meant for uid, msg)
        self.cut: set[tuple[str, str]] = set()
        self.drop: Callable[[str, str, Any], bool] = lambda s, d, m: False
        self.rewrite: Callable[[str, str, Any], Any] = lambda s, d, m: m
        self.wipes: dict[str, int] = {}
        for i, nid in enumerate(list(ids) + list(joiners)):
            self.disks.new(nid, uid_for(nid), founded=nid not in joiners)
            self.applied[nid], self.readies[nid] = [], []
            self._boot(nid, random.Random(i))

    def _boot(self, nid: str, rng: random.Random) -> None:
        self.nodes[nid] = RaftNode(nid, self.storages[nid], self.cfg, rng, self.now)

    def uid(self, nid: str) -> str:
        """The store uid of node nid's current disk."""
        return self.storages[nid].uid

    # -- time and I/O -----------------------------------------------------------------------
    def advance(self, dt: float) -> None:
        """Move the clock without ticking anyone."""
        self.now += dt

    def flush(self, nid: str) -> None:
        """Persist, apply and queue the messages of every Ready of node nid (consensus.ready.drive)."""
        drive(self.nodes[nid], _Flush(self, nid))

    def deliver(self, limit: int = 10_000) -> int:
        """Deliver queued messages (and what they cause) until quiet; returns how many."""
        count = 0
        for nid in self.nodes:
            self.flush(nid)
        while self.queue and count < limit:
            sender, dst, uid, m = self.queue.pop(0)
            src = sender.node_id
            if (src, dst) in self.cut or dst not in self.nodes or self.drop(src, dst, m):
                continue
            count += 1
            self.nodes[dst].step(self.now, sender, self.rewrite(src, dst, m), uid)
            self.flush(dst)
        return count

    def tick(self, nid: str) -> None:
        """Jump the clock to node nid's next deadline and tick it (others are not ticked)."""
        self.now = max(self.now, self.nodes[nid].next_deadline())
        self.nodes[nid].tick(self.now)
        self.flush(nid)

    def elect(self, nid: str) -> None:
        """Let nid's election timer fire and deliver everything."""
        self.tick(nid)
        self.deliver()

    def run(self, duration: float, nodes: list[str] | None = None) -> None:
        """Tick nodes (all by default) in deadline order for duration, delivering as we go."""
        until = self.now + duration
        names = nodes or list(self.nodes)
        while True:
            nid = min(names, key=lambda n: self.nodes[n].next_deadline())
            if self.nodes[nid].next_deadline() > until:
                break
            self.tick(nid)
            self.deliver()
        self.now = until

    def heartbeat(self, nid: str) -> None:
        """Let the leader nid send one round of heartbeats and deliver everything."""
        self.tick(nid)
        self.deliver()

    # -- faults -----------------------------------------------------------------------------
    def isolate(self, nid: str) -> None:
        """Cut every link to and from nid."""
        for other in self.nodes:
            if other != nid:
                self.cut |= {(nid, other), (other, nid)}

    def heal(self) -> None:
        """Restore every link."""
        self.cut.clear()

    def restart(self, nid: str) -> None:
        """Crash nid (losing unpersisted state and queued messages to it) and rebuild it."""
        self.queue = [q for q in self.queue if nid not in (q[0].node_id, q[1])]
        self._boot(nid, random.Random(99))

    def wipe(self, nid: str) -> None:
        """Crash nid and restart it on a new disk under the same node id: a new store uid, and
        only the founding configuration (what the box's own config names) in its log."""
        self.queue = [q for q in self.queue if nid not in (q[0].node_id, q[1])]
        self.wipes[nid] = self.wipes.get(nid, 0) + 1
        self.disks.new(nid, uid_for(nid, self.wipes[nid]))
        self.applied[nid] = []
        self.checker.forget(nid)
        self._boot(nid, random.Random(98))

    def leaders(self) -> list[str]:
        """Nodes that believe they lead."""
        return [n for n, node in self.nodes.items() if node.role is Role.LEADER]

    def propose(self, nid: str, i: int) -> Any:
        """Propose kv i at nid and deliver."""
        res = self.nodes[nid].propose(EntryKind.KV_PUT, kv(i))
        self.deliver()
        return res

    def sent(self, nid: str, kind: type) -> list[tuple[str, Any]]:
        """Every (dst, msg) of type kind that nid has emitted so far."""
        return [(d, m) for rd in self.readies[nid] for d, _, m in rd.messages if isinstance(m, kind)]


class _Flush:
    """The RaftNet's ReadyHandler for one node: its disk, its applied list, the queue, the checker."""

    def __init__(self, net: RaftNet, nid: str) -> None:
        self.net, self.nid, self.st = net, nid, net.storages[nid]

    def persist(self, rd: Ready) -> None:
        persist(self.st, rd)

    def apply(self, entries: tuple) -> None:
        for e in entries:
            self.st.apply_to(e.index)
            self.net.applied[self.nid].append(e)
            self.net.checker.on_apply(self.nid, e, False)

    def send(self, messages: tuple) -> None:
        me = self.net.nodes[self.nid].identity
        self.net.queue.extend((me, dst, uid, m) for dst, uid, m in messages)

    def observe(self, rd: Ready) -> None:
        self.net.readies[self.nid].append(rd)
        self.net.checker.on_ready(self.nid, self.net.nodes[self.nid], rd)
