"""Scripted schedules for the planted regressions (test_planted.py): each drives the cluster into
the situation a fixed bug once broke, so the run is clean on today's code and a violation with
the bug planted back."""

from __future__ import annotations

import asyncio

from dpeer import errors
from dpeer.consensus import Role
from dpeer.sim.network import LinkPolicy

from tests.house.cluster import House


def leader_of(house: House) -> str | None:
    """The box that leads now, if any."""
    return next((n for n in house.up() if house.boxes[n].daemon.node.role is Role.LEADER
                 and n not in house.strangers), None)


async def power_loss(house: House) -> None:
    """Every box loses power at once and comes back: the committed view was handed to workers
    that are gone, and nothing changes by itself (the missed-view loop must re-form the group)."""
    await asyncio.sleep(0.5)
    boxes = house.up()
    for nid in boxes:
        await house.crash(nid)
    await asyncio.sleep(0.5)
    for nid in boxes:
        house.boxes[nid].worker.build_s = 0.0  # built before its daemon's first chores (started early)
        house.start(nid)


async def minority_holds_the_group(house: House) -> None:
    """The two boxes that train (the others never build their job) are cut off from the three
    others: a minority with the whole group, which must stop training once it knows no leader."""
    await asyncio.sleep(0.3)
    group, rest = ["n1", "n2"], ["n3", "n4", "n5"]
    for a in group:
        for b in rest:
            house.cut(a, b)
            house.cut(b, a)
    await asyncio.sleep(8.0)
    house.heal()


async def amnesia(house: House) -> None:
    """The founder loses its disk and its unit starts it as it was first started (no --join): it
    founds a cluster again. With store identities that is another cluster; without, it is the
    same founding under the same identity, and its log then diverges from the real cluster's."""
    await asyncio.sleep(0.3)
    # No operator traffic: a command forwarded to the founder's address would now reach the other
    # cluster's leader, which answers it from its own state (a finding of its own, see the report).
    house.operator_paused = True
    founder = house.founders[0]
    await house.wipe(founder)
    house.start(founder, join=[])
    await asyncio.sleep(2.0)
    # the operator notices and does it right: a fresh disk joining through the others
    await house.wipe(founder)
    house.start(founder)
    house.operator_paused = False
    await asyncio.sleep(2.0)


async def force_on_a_healthy_follower(house: House) -> None:
    """An operator runs `dpeer force` on a follower of a healthy cluster that lags a little (its
    link from the leader is slow): it must be refused, or the entries it lacks are lost."""
    await asyncio.sleep(0.3)
    leader = leader_of(house)
    assert leader is not None, "no leader after boot"
    follower = next(n for n in house.founders if n != leader)
    house.links.set_link(leader, follower, LinkPolicy(delay_min=0.3, delay_max=0.3))
    for i in range(5):
        await house.client(leader).kv_put(f"lag{i}", str(i))
    try:
        await house.client(follower).force([follower])
    except errors.BadRequest:
        pass
    await asyncio.sleep(2.0)


async def stranger(house: House) -> None:
    """A box of another cluster (it founded its own, and committed more) gossips with ours:
    none of its committed entries may enter our logs."""
    nid = "n4"
    house.strangers.add(nid)
    house.boxes[nid].worker.cluster = "stranger"
    house.start(nid, join=[])
    await asyncio.sleep(1.0)
    for i in range(40):
        try:
            await house.client(nid).kv_put(f"stranger{i}", str(i))
        except errors.PeerError:
            pass
    house.boxes[nid].daemon.node.join_seeds([house.boxes[n].addr for n in house.founders])
    await asyncio.sleep(3.0)
