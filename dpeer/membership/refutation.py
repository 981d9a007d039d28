"""How far a refutation goes, and how often the far kind may go.

A suspicion backed by a refused connection runs on a timer (0.2 s on lan) shorter than gossip
takes to spread a refutation, so the accused sends its new incarnation straight to every live
member. Unbounded, that is an amplifier: a member repeating "SUSPECT you, refused" would make the
accused send N messages per accusation. ``FanoutCap`` allows one such broadcast per spacing (a
quarter of the refused timer) and folds the accusations in between into one held-back broadcast
when the spacing ends, still well inside the timer; each accuser is answered at once either way.
"""

from __future__ import annotations

import enum
import math

SPACING_SHARE = 4
"""The refused suspicion timer over the broadcasts' spacing: a held-back broadcast lands within a
quarter of the timer, leaving three quarters for it to reach the members."""


class Fanout(enum.Enum):
    """What FanoutCap.claim allows for one refused accusation."""

    NOW = "now"  # broadcast to every live member now
    HOLD = "hold"  # hold the broadcast back: set a timer for FanoutCap.due
    HELD = "held"  # a held-back broadcast is already due: it will carry the newest incarnation


class FanoutCap:
    """At most one refutation broadcast to every live member per ``spacing`` seconds."""

    __slots__ = ("spacing", "_last", "_held")

    def __init__(self, refused_timeout: float) -> None:
        self.spacing = refused_timeout / SPACING_SHARE
        self._last = -math.inf  # when the last broadcast went out
        self._held = False

    def claim(self, now: float) -> Fanout:
        """Whether a refused accusation's refutation is broadcast now, held back, or folded into
        the broadcast already held back."""
        if self._held:
            return Fanout.HELD
        if now - self._last >= self.spacing:
            self._last = now
            return Fanout.NOW
        self._held = True
        return Fanout.HOLD

    @property
    def due(self) -> float:
        """When the held-back broadcast may go."""
        return self._last + self.spacing

    def release(self, now: float) -> None:
        """The held-back broadcast goes out now."""
        self._held, self._last = False, now


def refutation_targets(live_addrs: set[str], sender: str | None, own_addr: str) -> list[str]:
    """Where a refutation goes: the live members given (none unless broadcasting) and the accuser,
    when it named itself and is not us; sorted, so a seeded run sends in the same order."""
    targets = set(live_addrs)
    if sender is not None and sender != own_addr:
        targets.add(sender)
    return sorted(targets)
