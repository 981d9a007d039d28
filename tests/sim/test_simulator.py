"""The simulator itself: determinism, partitions, crashes, pauses and refused connections."""

from __future__ import annotations

from typing import Any

from dpeer.sim.simulator import Outbox, Simulator


class Pinger:
    """Sends a numbered ping to every peer each period and records what it receives."""

    def __init__(self, me: str, peers: list[str], period: float = 0.1) -> None:
        self.me, self.peers, self.period = me, peers, period
        self.next_at = 0.0
        self.seq = 0
        self.got: list[tuple[float, str, Any]] = []
        self.refused: list[str] = []

    def receive(self, now: float, src: str, msg: Any) -> Outbox:
        self.got.append((now, src, msg))
        return []

    def tick(self, now: float) -> Outbox:
        self.seq += 1
        self.next_at = now + self.period
        return [(p, (self.me, self.seq)) for p in self.peers]

    def next_tick(self) -> float:
        return self.next_at

    def unreachable(self, now: float, dst: str) -> Outbox:
        self.refused.append(dst)
        return []


def three(seed: int = 7) -> Simulator:
    sim = Simulator(seed)
    ids = ["a", "b", "c"]
    for n in ids:
        sim.add(n, Pinger(n, [p for p in ids if p != n]))
    return sim


def test_same_seed_same_run() -> None:
    runs = []
    for _ in range(2):
        sim = three(seed=42)
        sim.network.set_loss(0.3)
        sim.run_until(2.0)
        runs.append([sim.actor(n).got for n in "abc"])
    assert runs[0] == runs[1]


def test_partition_cuts_and_heal_restores() -> None:
    sim = three()
    sim.network.partition(["a"], ["b", "c"])
    sim.run_until(1.0)
    assert all(src != "a" for _, src, _ in sim.actor("b").got)
    assert sim.actor("a").got == []
    sim.network.heal()
    sim.run_until(2.0)
    assert any(src == "a" for _, src, _ in sim.actor("b").got)


def test_one_way_partition() -> None:
    sim = three()
    sim.network.partition(["a"], ["b"], one_way=True)
    sim.run_until(1.0)
    assert not any(src == "a" for _, src, _ in sim.actor("b").got)
    assert any(src == "b" for _, src, _ in sim.actor("a").got)


def test_crash_refuses_senders_and_restart_resumes() -> None:
    sim = three()
    sim.run_until(0.5)
    sim.crash("c")
    sim.run_until(1.0)
    assert "c" in sim.actor("a").refused
    fresh = Pinger("c", ["a", "b"])
    sim.restart("c", fresh)
    sim.run_until(1.5)
    assert fresh.got and fresh.seq > 0


def test_pause_holds_messages_until_resume() -> None:
    sim = three()
    sim.pause("b")
    sim.run_until(1.0)
    paused = sim.actor("b")
    assert paused.got == [] and paused.seq == 0
    assert "b" not in sim.actor("a").refused
    sim.resume("b")
    sim.run_until(1.0001)
    assert len(paused.got) >= 10


def test_check_runs_after_every_event() -> None:
    sim = three()
    seen: list[float] = []
    sim.run_until(0.5, check=lambda s: seen.append(s.now))
    assert len(seen) == sim.stats.events and seen == sorted(seen)
