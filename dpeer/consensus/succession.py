"""Who campaigns first once gossip declares the leader dead: a pure rule over the voters.

Every survivor ranks the same voters, so the first campaigns alone at once instead of all of
them waiting out random election timeouts (and sometimes splitting the vote); the next follows
a slot later in case the first cannot win (dead too, cut off, or behind).
"""

from __future__ import annotations

from typing import Iterable


def successor_delay(
    voters: Iterable[str], me: str, lost: str, heartbeat_interval: float, election_timeout_min: float,
    jitter: float,
) -> float:
    """Seconds from the verdict on `lost` to our campaign: half a heartbeat (time for the other
    voters' detectors to agree and drop its lease), then one slot of half election_timeout_min
    per surviving voter before us in id order. A node that is not a voter gets the place after
    the last voter, which it shares with every other such node, so `jitter` (in [0, 1)) of a
    quarter slot spreads them; a voter's place is its own and waits no jitter."""
    successors = sorted(v for v in voters if v != lost)
    place = successors.index(me) if me in successors else len(successors)
    slot = election_timeout_min / 2
    return heartbeat_interval / 2 + (place + (jitter / 4 if me not in successors else 0.0)) * slot
