"""A voter that missed the entry adding a box follows that box once it leads (the seed-495 stall).

A follower is cut off while a spare joins and becomes a voter; the leader then loses power and
comes back, and the newcomer wins the election. The cut-off follower's configuration does not name the new leader:
it must still take that leader's entries (Raft's rule: a leader of its term or a newer one is
followed whatever configuration this node knows), or it refuses them for good, never learns the
configuration that names the leader, and every group the leader forms with it fails.
"""

from __future__ import annotations

import asyncio

import pytest

from dpeer.consensus import Role
from tests.house.cluster import House, quiet_logs
from tests.house.scenarios import leader_of
from tests.house.sim import run

SPARE = "n4"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    quiet_logs()


async def _until(house: House, ok, seconds: float) -> bool:
    """Poll ok() every 0.05 virtual s for at most `seconds`."""
    end = house.loop.time() + seconds
    while house.loop.time() < end:
        if ok():
            return True
        await asyncio.sleep(0.05)
    return ok()


def _voters(house: House, nid: str) -> tuple[str, ...]:
    return tuple(house.boxes[nid].daemon.store.state.voters)


async def _newcomer_leads_past_a_cut_follower(house: House, seen: dict) -> None:
    await asyncio.sleep(1.5)  # trained together for a while
    leader = leader_of(house)
    assert leader is not None, "no leader after boot"
    cut = next(n for n in house.up() if n != leader)
    for other in house.boxes:
        if other != cut:
            house.cut(cut, other)
            house.cut(other, cut)
    house.start(SPARE)
    assert await _until(house, lambda: SPARE in _voters(house, leader), 8.0), "the spare never became a voter"
    await house.crash(leader)  # a power cut: the others campaign, and the leader's vote counts once it is back
    await asyncio.sleep(0.3)
    house.start(leader)
    await _until(house, lambda: leader_of(house) not in (None, leader), 8.0)
    seen["new_leader"], seen["cut_knows"] = leader_of(house), _voters(house, cut)
    house.heal()
    await _until(house, lambda: house.boxes[cut].daemon.node.role is Role.FOLLOWER
                 and SPARE in _voters(house, cut), 8.0)
    seen["cut_learned"] = SPARE in _voters(house, cut)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_follower_that_missed_the_newcomers_entry_follows_it_once_it_leads(seed: int) -> None:
    seen: dict = {}
    result = run(seed, seconds=20.0, scenario=lambda house: _newcomer_leads_past_a_cut_follower(house, seen))
    assert seen.get("new_leader") == SPARE and SPARE not in seen["cut_knows"], seen  # the path under test ran
    assert result.violation is None, result.violation
    assert seen["cut_learned"], seen
