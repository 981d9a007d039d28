"""How far a refutation goes, and how often the far kind may go.

A suspicion backed by a refused connection runs on a timer (0.2 s on lan) shorter than gossip
takes to spread a refutation, so the accused sends its new incarnation straight to every live
member. Unbounded, that is an amplifier: a member repeating "SUSPECT you, refused" would make the
accused send N messages per accusation. ``FanoutCap`` allows one such broadcast per spacing (a
quarter of the refused timer) and folds the accusations in between into one held-back broadcast
when the spacing ends, still well inside the timer; each accuser is answered at once either way.
``Refuter`` is core.Membership's collaborator that applies these rules to claims about this node.
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING

from dpeer.membership.messages import Datagram, Gossip
from dpeer.membership.table import LIVE
from dpeer.membership.timers import Timer

if TYPE_CHECKING:
    from dpeer.membership.core import Membership

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


class Refuter:
    """Answers suspect, dead and left rumours about this node with a higher incarnation.
    fanout: the cap on refutation broadcasts to every live member."""

    def __init__(self, node: Membership) -> None:
        self.node = node
        self.fanout = FanoutCap(node.config.refused_suspicion_timeout)

    def about_me(self, now: float, node_id: str, incarnation: int, sender: str | None, refused: bool,
                 out: list[Datagram]) -> bool:
        """True when a suspect, dead or left rumour is about this node, which refutes it (unless leaving)."""
        node = self.node
        if node_id != node.node_id:
            return False
        if incarnation >= node.incarnation and not node.leaving:
            self.refute(now, incarnation, sender, refused, out)
        return True

    def refute(self, now: float, accused: int, sender: str | None, refused: bool, out: list[Datagram]) -> None:
        """Outbid an accusation with a higher incarnation, answering its sender. A refused one runs on
        the short refused timer, which gossip cannot outrun, so the refutation also goes straight to
        every live member, at most once per the fan-out cap's spacing."""
        node = self.node
        node.incarnation = max(node.incarnation + 1, accused + 1)
        node.prober.awareness.apply(1)
        node.dissemination.push(node.own_update())
        fanout = self.fanout.claim(now) if refused else None
        if fanout is Fanout.HOLD:
            node.timers.set(self.fanout.due, Timer.REFUTE_BROADCAST, None)
        self._broadcast(now, sender, fanout is Fanout.NOW, out)

    def release(self, now: float, out: list[Datagram]) -> None:
        """The held-back broadcast's timer fired: send it (a leaving node spreads its `left`, never
        an alive refutation)."""
        self.fanout.release(now)
        if not self.node.leaving:
            self._broadcast(now, None, True, out)

    def _broadcast(self, now: float, sender: str | None, everyone: bool, out: list[Datagram]) -> None:
        """Send our current incarnation to the sender, and to every live member when ``everyone``."""
        node = self.node
        live = {m.addr for m in node.roster.table if m.state in LIVE} if everyone else set()
        gossip = Gossip(node.heartbeat(now), (node.own_update(),))
        out.extend((a, gossip) for a in refutation_targets(live, sender, node.addr))
