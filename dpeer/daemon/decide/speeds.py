"""Mixed speeds: each box's speed class, and the shares of a step's micro-batches the leader plans
from them, as pure decisions (issue 41).

A box's worker measures its speed (micro-batches a second); its daemon turns that into a class on
a quarter-octave scale (`speed_class`, with hysteresis, so a speed near a boundary does not flap)
and its member record carries the class. The leader gives each member of a view a share of a
step's work (`plan_shares`): the fastest class gets FULL_SHARE, a box twice as slow half of it,
and every member the same while any member's class is unknown. A change of the shares alone is
taken only where it cuts the step's predicted time by MIN_GAIN (`worth_resharing`): re-forming a
group costs a few steps, and speeds measured on a busy box wander. The shares change where the
work is done, never the step's result (the exact reduction).
"""

from __future__ import annotations

import math
from typing import Sequence

from dpeer.statemachine.payloads import MAX_SPEED_CLASS, MIN_SPEED_CLASS
from dpeer.view import share_counts

CLASSES_PER_OCTAVE = 4  # a class is a quarter octave: speeds about 19% apart
HOLD = 0.6  # a box keeps its class while its speed stays within this many classes of it
FULL_SHARE = 8  # the share of the fastest members (a view's weights run from 1 to this)
RESHARE_EVERY = 30.0  # seconds a view's shares stand before a change of the shares alone re-forms the group
MIN_GAIN = 0.1  # a change of the shares alone must cut the step's predicted time by this fraction


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


def step_time(units: int, shares: Sequence[int], classes: Sequence[int]) -> float:
    """A step's predicted time, in seconds per unit of the fastest possible box: its slowest
    member's units (`share_counts` of the step's `units`; empty shares: even) over its speed,
    2 ** (class / 4) units a second."""
    counts = share_counts(units, shares or [1] * len(classes))
    return max(count / 2 ** (c / CLASSES_PER_OCTAVE) for count, c in zip(counts, classes))


def worth_resharing(units: int, current: Sequence[int], planned: Sequence[int],
                    classes: Sequence[int | None]) -> tuple[bool, str]:
    """Whether the same members should re-form with `planned` shares instead of `current` ones,
    with the reason: yes while any class is unknown (an older build splits evenly, so the shares
    must go even), else only if the planned split of a step's `units` (micro-batches, or samples in
    fast mode) cuts its predicted time by MIN_GAIN: a split that moves no unit is not worth a re-form.
    Yes too, unpredicted, where the current or the planned shares are not one per member (nor
    even), or there are no units or no members."""
    known = [c for c in classes if c is not None]
    if len(known) < len(classes):
        return True, "even shares while a member's speed is unknown"
    odd = next((len(s) for s in (current, planned) if len(s) not in (0, len(classes))), None)
    if odd is not None or units < 1 or not classes:
        shares = len(current) if odd is None else odd
        return True, f"no prediction for {shares} shares of {len(classes)} members over {units} units"
    before, after = step_time(units, current, known), step_time(units, planned, known)
    ratio = after / before
    if ratio <= 1 - MIN_GAIN:
        return True, f"the step's predicted time {ratio:.2f}x"
    return False, (f"the new shares would take the step's predicted time to {ratio:.2f}x of the current "
                   f"shares' (a re-form for the shares alone needs {1 - MIN_GAIN:.2f}x or less)")
