"""The seeded fault schedule (Plan, schedule) and the record of one injected fault (Fault)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class Plan:
    """The seeded choices of one fault, drawn before the run knows which nodes are eligible."""

    gap: float
    kind: str
    pick: float
    length: float
    strength: float


@dataclass
class Fault:
    """One injected fault and what followed it (times in seconds since the run started)."""

    id: int
    kind: str
    nodes: list[str]
    at: float
    planned_s: float
    detail: str = ""
    step_at: int = 0
    gen_at: int = 0
    old_gen_step: int = 0
    ended_at: float | None = None
    step_at_end: int = 0
    recovered_s: float | None = None
    recovered_how: str = ""
    back_s: float | None = None
    out_s: float | None = None
    wiped_to: str | None = None


def schedule(seed: int, kinds: tuple[str, ...], fault_every: float, count: int = 10_000) -> list[Plan]:
    """The seeded schedule: kinds come in shuffled rounds (every kind once per round)."""
    rng = random.Random(seed)
    plans: list[Plan] = []
    while len(plans) < count:
        order = list(kinds)
        rng.shuffle(order)
        for kind in order:
            plans.append(Plan(rng.uniform(0.5, 1.5) * fault_every, kind, rng.random(), rng.random(), rng.random()))
    return plans[:count]
