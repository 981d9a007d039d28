"""Mixed speeds: each box's speed class, and the shares of a step's micro-batches the leader plans
from them, as pure decisions (issue 41).

A box's worker measures its speed (micro-batches a second); its daemon turns that into a class on
a quarter-octave scale (`speed_class`, with hysteresis, so a speed near a boundary does not flap)
and its member record carries the class. The leader gives each member of a view a share of a
step's work (`plan_shares`): the fastest class gets FULL_SHARE, a box twice as slow half of it,
and every member the same while any member's class is unknown. The shares change where the work is done, never the step's result (the exact reduction).
"""

from __future__ import annotations

import math
from typing import Sequence

from dpeer.statemachine.payloads import MAX_SPEED_CLASS, MIN_SPEED_CLASS

CLASSES_PER_OCTAVE = 4  # a class is a quarter octave: speeds about 19% apart
HOLD = 0.6  # a box keeps its class while its speed stays within this many classes of it
FULL_SHARE = 8  # the share of the fastest members (a view's weights run from 1 to this)
RESHARE_EVERY = 30.0  # seconds a view's shares stand before a change of the shares alone re-forms the group


def speed_class(rate: float, current: int | None) -> int:
    """The class of `rate` micro-batches a second (finite, > 0): round(4 * log2(rate)), clamped to
    the records' range; `current` stands while the rate is within HOLD of it (hysteresis)."""
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"a speed must be a finite number of micro-batches a second above 0, not {rate!r}")
    exact = CLASSES_PER_OCTAVE * math.log2(rate)
    if current is not None and abs(exact - current) < HOLD:
        return current
    return max(MIN_SPEED_CLASS, min(MAX_SPEED_CLASS, round(exact)))


def plan_shares(classes: Sequence[int | None]) -> tuple[tuple[int, ...], str]:
    """Each member's share of a step by its speed class in rank order, with the reason: the fastest
    class gets FULL_SHARE, each class below it a quarter octave less (at least 1). Even shares, (),
    while any member's class is unknown: a box of an older build (or `split: even`) tells none and
    splits evenly whatever the view says, so only an even split keeps every rank's part the same."""
    unknown = [rank for rank, c in enumerate(classes) if c is None]
    if unknown:
        return (), f"even shares: {len(unknown)} member(s) of unknown speed (rank {unknown[0]} first)"
    top = max(classes, default=0)
    shares = tuple(max(1, round(FULL_SHARE * 2 ** ((c - top) / CLASSES_PER_OCTAVE))) for c in classes)
    if len(set(shares)) <= 1:
        return (), "even shares: every member is as fast as the fastest"
    return shares, f"shares {','.join(map(str, shares))} by speed class (fastest class {top})"
