"""Helpers for the membership tests: seeded simulated clusters with effect logs and invariants."""

from __future__ import annotations

import os
import random
from typing import Callable
from dataclasses import dataclass, field

import pytest

from dpeer.membership import (
    Effect,
    MemberChanged,
    SeenDead,
    MemberRecord,
    MemberState,
    MembershipConfig,
    lan,
    wire_size,
)
from dpeer.membership.sim_adapter import SimMember, sim_addr
from dpeer.sim.network import LinkPolicy, SimNetwork
from dpeer.sim.simulator import Simulator

slow = pytest.mark.skipif(os.environ.get("DPEER_SLOW") != "1", reason="set DPEER_SLOW=1 for long variants")


def checked_size(msg: object) -> int:
    """Validate every simulated message as the transport would, and count its bytes."""
    msg.validate()  # type: ignore[attr-defined]
    return wire_size(msg)  # type: ignore[arg-type]


@dataclass
class SwimCluster:
    """A simulated cluster plus a log of every effect: (time, observer, effect)."""

    sim: Simulator
    config: MembershipConfig
    log: list[tuple[float, str, Effect]] = field(default_factory=list)
    incarnations: dict[tuple[str, str], int] = field(default_factory=dict)

    def sink(self, now: float, observer: str, effect: Effect) -> None:
        """Record an effect and check that incarnations seen by one observer never go down."""
        if isinstance(effect, MemberChanged):
            key = (observer, effect.node_id)
            last = self.incarnations.get(key, -1)
            assert effect.incarnation >= last, (
                f"seed {self.sim.seed}: {observer} saw {effect.node_id} go from incarnation {last} to "
                f"{effect.incarnation} at t={now:.3f}"
            )
            self.incarnations[key] = effect.incarnation
            self.log.append((now, observer, effect))

    def node(self, node_id: str, seed_offset: int, **kwargs: object) -> SimMember:
        """A new actor whose effects land in this cluster's log."""
        return SimMember(node_id, self.config, self.sim.seed * 7919 + seed_offset, self.sim.now, sink=self.sink, **kwargs)  # type: ignore[arg-type]

    def state(self, observer: str, node_id: str) -> MemberState | None:
        """What observer currently believes about node_id."""
        return self.sim.actor(observer).core.state_of(node_id)

    def deaths(self, node_id: str | None = None) -> list[tuple[float, str, str]]:
        """(time, observer, dead node) for every SeenDead effect, optionally about one node."""
        return [
            (t, obs, e.node_id) for t, obs, e in self.log
            if isinstance(e, SeenDead) and (node_id is None or e.node_id == node_id)
        ]

    def all_see(self, node_id: str, states: set[MemberState], among: list[str] | None = None) -> bool:
        """True when every live node (or `among`) other than node_id sees it in one of `states`."""
        observers = among if among is not None else self.sim.live()
        return all(self.state(o, node_id) in states for o in observers if o != node_id)


def make_cluster(
    n: int, seed: int, config: MembershipConfig | None = None, loss: float = 0.0, bootstrap: bool = True
) -> tuple[SwimCluster, list[str]]:
    """n nodes n00..; bootstrapped with the full member list, or joining through n00."""
    network = SimNetwork(random.Random(seed ^ 0x5EED), LinkPolicy(loss=loss))
    sim = Simulator(seed, network=network, size_of=checked_size)
    cluster = SwimCluster(sim, config or lan())
    ids = [f"n{i:02d}" for i in range(n)]
    known = [MemberRecord(i, sim_addr(i), MemberState.ALIVE, 0) for i in ids] if bootstrap else []
    for k, node_id in enumerate(ids):
        seeds = [] if bootstrap or k == 0 else [ids[0]]
        sim.add(node_id, cluster.node(node_id, k, known=known, seeds=seeds))
    return cluster, ids


def first_time(cluster: SwimCluster, until: float, cond: Callable[[], bool], step: float = 0.05) -> float | None:
    """Run the simulation in small steps until cond() holds; the time it first held, or None."""
    while cluster.sim.now < until:
        cluster.sim.run_for(step)
        if cond():
            return cluster.sim.now
    return None
