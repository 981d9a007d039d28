"""Who campaigns first once the failure detector declares the leader lost: a pure rule over the voters.

Every survivor ranks the same voters, so the first campaigns alone at once instead of all of
them waiting out random election timeouts (and sometimes splitting the vote); the next follows
a slot later in case the first cannot win (dead too, cut off, or behind). The first does not wait
for the other voters' detectors to agree: a voter that still holds the lost leader's lease refuses
the pre-vote, and the first asks again after LEASE_RETRY of a heartbeat, then twice as long each
time (election.Election.retry_after_lease).
"""

from __future__ import annotations

from typing import Iterable

LEASE_RETRY = 0.1  # of a heartbeat interval: the first wait before a pre-vote refused for a lease is asked again


def successor_delay(voters: Iterable[str], me: str, lost: str, election_timeout_min: float, jitter: float) -> float:
    """Seconds from the verdict on `lost` to our campaign: one slot of half election_timeout_min
    per surviving voter before us in id order (the first: none). A node that is not a voter gets
    the place after the last voter, which it shares with every other such node, so `jitter` (in
    [0, 1)) of a quarter slot spreads them; a voter's place is its own and waits no jitter."""
    successors = sorted(v for v in voters if v != lost)
    place = successors.index(me) if me in successors else len(successors)
    slot = election_timeout_min / 2
    return (place + (jitter / 4 if me not in successors else 0.0)) * slot
