"""Seeded simulations: crashes, restarts, partitions, loss, pauses and joins, with invariants.

Every assertion message carries the seed; rerun one with the same seed to reproduce it.
"""

from __future__ import annotations

from typing import Callable

import pytest

from dpeer.membership import SeenDead, MemberState
from dpeer.sim.simulator import Simulator

from .cluster import SwimCluster, first_time, make_cluster, slow

ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
SEEDS = [11, 12, 13]


def no_false_death(cluster: SwimCluster, allowed: frozenset[str] = frozenset()) -> Callable[[Simulator], None]:
    """A check run after every event: no live node is ever declared dead (loss-only runs)."""
    seen = [0]

    def check(sim: Simulator) -> None:
        log = cluster.log
        for i in range(seen[0], len(log)):
            t, observer, effect = log[i]
            if isinstance(effect, SeenDead) and effect.node_id not in allowed:
                raise AssertionError(f"seed {sim.seed}: {observer} declared live {effect.node_id} dead at t={t:.3f}")
        seen[0] = len(log)

    return check


@pytest.mark.parametrize("seed", SEEDS)
def test_crash_is_seen_by_everyone_quickly(seed: int) -> None:
    # the first refused connection comes with the next probe of the dead node (about 2/s
    # cluster-wide), then 0.2 s of grace and gossip: about 0.6 s median (see BENCHMARKS.md)
    cluster, ids = make_cluster(8, seed)
    cluster.sim.run_until(5.0, no_false_death(cluster))
    cluster.sim.crash("n03")
    t = first_time(cluster, 10.0, lambda: cluster.all_see("n03", {DEAD}), step=0.01)
    assert t is not None and t - 5.0 <= 2.0, f"seed {seed}: crash seen everywhere after {t}"
    assert {n for _, _, n in cluster.deaths()} == {"n03"}, f"seed {seed}: {cluster.deaths()}"


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("durable_incarnation", [False, True])
def test_restart_comes_back_with_a_higher_incarnation(seed: int, durable_incarnation: bool) -> None:
    cluster, ids = make_cluster(6, seed)
    sim = cluster.sim
    sim.run_until(3.0)
    sim.crash("n02")
    sim.run_until(6.0)
    assert cluster.all_see("n02", {DEAD}), f"seed {seed}"
    dead_inc = sim.actor("n00").core.member("n02").incarnation
    start_inc = dead_inc + 1 if durable_incarnation else 0
    sim.restart("n02", cluster.node("n02", 100, incarnation=start_inc, seeds=["n00"]))
    t = first_time(cluster, 12.0, lambda: cluster.all_see("n02", {ALIVE}))
    assert t is not None, f"seed {seed}: restarted n02 not alive everywhere"
    assert sim.actor("n02").core.incarnation > dead_inc, f"seed {seed}"
    assert all(sim.actor("n02").core.state_of(n) is ALIVE for n in ids if n != "n02"), f"seed {seed}"


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_symmetric_partition_splits_then_heals(seed: int) -> None:
    cluster, ids = make_cluster(8, seed)
    sim = cluster.sim
    left, right = ids[:4], ids[4:]
    sim.run_until(2.0)
    sim.network.partition(left, right)
    sim.run_until(14.0)
    for a in left:
        for b in right:
            assert cluster.state(a, b) is DEAD and cluster.state(b, a) is DEAD, f"seed {seed}: {a} {b}"
    for side in (left, right):
        assert all(cluster.state(a, b) is ALIVE for a in side for b in side if a != b), f"seed {seed}"
    sim.network.heal()
    t = first_time(cluster, 14.0 + 25.0, lambda: all(cluster.all_see(n, {ALIVE}) for n in ids), step=0.5)
    assert t is not None, f"seed {seed}: partition did not heal"


@pytest.mark.parametrize("seed", SEEDS)
def test_one_way_partition_causes_no_false_death(seed: int) -> None:
    cluster, ids = make_cluster(6, seed)
    cluster.sim.network.block("n00", "n01")
    cluster.sim.network.block("n02", "n03")
    cluster.sim.run_until(60.0, no_false_death(cluster))


@pytest.mark.parametrize("seed", SEEDS)
def test_bridge_node_prevents_false_death(seed: int) -> None:
    cluster, ids = make_cluster(3, seed)
    cluster.sim.network.partition(["n00"], ["n02"])  # A and C cannot talk; B reaches both
    cluster.sim.run_until(60.0, no_false_death(cluster))
    assert all(cluster.all_see(n, {ALIVE, SUSPECT}) for n in ids), f"seed {seed}"


@pytest.mark.parametrize("seed", SEEDS)
def test_ten_percent_loss_no_false_positive(seed: int) -> None:
    cluster, ids = make_cluster(10, seed, loss=0.10)
    cluster.sim.run_until(180.0, no_false_death(cluster))
    incs = [cluster.sim.actor(n).core.incarnation for n in ids]
    assert all(cluster.all_see(n, {ALIVE, SUSPECT}) for n in ids), f"seed {seed}: incarnations {incs}"


@pytest.mark.parametrize("seed", SEEDS)
def test_paused_node_dies_then_refutes_on_resume(seed: int) -> None:
    cluster, ids = make_cluster(8, seed)
    sim = cluster.sim
    sim.run_until(4.0)
    sim.pause("n05")
    t = first_time(cluster, 12.0, lambda: cluster.all_see("n05", {DEAD}))
    assert t is not None and t - 4.0 <= 3.0, f"seed {seed}: paused node dead everywhere after {t}"
    sim.run_until(12.0)
    sim.resume("n05")
    back = first_time(cluster, 16.0, lambda: cluster.all_see("n05", {ALIVE}))
    assert back is not None and back - 12.0 <= 2.0, f"seed {seed}: resumed node alive after {back}"
    assert sim.actor("n05").core.incarnation >= 1, f"seed {seed}"
    assert {n for _, _, n in cluster.deaths()} == {"n05"}, f"seed {seed}: {cluster.deaths()}"


@pytest.mark.parametrize("accusers", [("n00",), ("n00", "n01", "n02")])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_false_refusal_of_a_live_node_is_refuted_not_a_death(seed: int, accusers: tuple[str, ...]) -> None:
    # the transport counts a connection reset as a refusal (a SIGKILLed peer resets its streams,
    # and that evidence makes a leader kill cost ~0.1 s); a live peer resets connections too, so
    # the short refused timer must still leave it time to refute
    cluster, ids = make_cluster(8, seed)
    sim = cluster.sim
    sim.run_until(4.0, no_false_death(cluster))
    for k, accuser in enumerate(accusers):  # separate resets, 0.05 s apart
        when = 4.0 + 0.05 * k
        sim.at(when, lambda a=accuser, t=when: sim.emit(a, sim.actor(a).unreachable(t, "n05")))
    sim.run_until(12.0, no_false_death(cluster))
    assert cluster.all_see("n05", {ALIVE}), f"seed {seed}"
    assert sim.actor("n05").core.incarnation >= 1, f"seed {seed}: n05 never refuted"


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_join_during_failures(seed: int) -> None:
    cluster, ids = make_cluster(8, seed, loss=0.05)
    sim = cluster.sim
    sim.run_until(3.0)
    sim.crash("n06")
    sim.crash("n07")
    sim.add("x", cluster.node("x", 500, seeds=["n06", "n00"]))  # its first seed is dead
    live = [n for n in ids if n not in ("n06", "n07")] + ["x"]
    done = first_time(
        cluster, 15.0,
        lambda: cluster.all_see("x", {ALIVE}, live)
        and all(cluster.state("x", n) is ALIVE for n in live if n != "x")
        and all(cluster.state("x", n) in (DEAD, None) for n in ("n06", "n07")),
        step=0.1,
    )
    assert done is not None, f"seed {seed}: join during failures did not converge"


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_graceful_leave_spreads(seed: int) -> None:
    cluster, ids = make_cluster(8, seed)
    cluster.sim.run_until(2.0)
    cluster.sim.actor("n04").request_leave()
    t = first_time(cluster, 6.0, lambda: cluster.all_see("n04", {LEFT}, [n for n in ids if n != "n04"]))
    assert t is not None, f"seed {seed}: leave did not spread"
    assert cluster.deaths() == [], f"seed {seed}"


def test_cluster_forms_through_a_seed() -> None:
    cluster, ids = make_cluster(12, 21, bootstrap=False)
    t = first_time(cluster, 10.0, lambda: all(cluster.all_see(n, {ALIVE}) for n in ids), step=0.1)
    assert t is not None, "seed 21: cluster did not form through n00"


def test_same_seed_replays_the_same_run() -> None:
    def run(seed: int) -> tuple[int, int, list]:
        cluster, ids = make_cluster(6, seed, loss=0.05)
        cluster.sim.run_until(3.0)
        cluster.sim.crash("n01")
        cluster.sim.run_until(8.0)
        return cluster.sim.stats.sent, cluster.sim.stats.bytes_sent, cluster.deaths()
    assert run(31) == run(31)


def test_five_percent_loss_ten_minutes_no_false_positive() -> None:
    cluster, ids = make_cluster(20, 41, loss=0.05)
    cluster.sim.run_until(600.0, no_false_death(cluster))


@slow
@pytest.mark.parametrize("seed", [42, 43])
def test_five_percent_loss_ten_minutes_hundred_nodes(seed: int) -> None:
    cluster, ids = make_cluster(100, seed, loss=0.05)
    cluster.sim.run_until(600.0, no_false_death(cluster))


@slow
@pytest.mark.parametrize("seed", [44, 45])
def test_crash_in_three_hundred_nodes(seed: int) -> None:
    cluster, ids = make_cluster(300, seed, loss=0.01)
    cluster.sim.run_until(5.0, no_false_death(cluster))
    cluster.sim.crash("n07")
    t = first_time(cluster, 15.0, lambda: cluster.all_see("n07", {DEAD}), step=0.1)
    assert t is not None, f"seed {seed}: crash not seen by all 299 nodes"
    assert {n for _, _, n in cluster.deaths()} == {"n07"}, f"seed {seed}"
