"""A storage fault in the log's last entry: a box loses power in the middle of a log append.

The simulated disk (tests/support/disk.py) leaves that append torn; on restart the store discards it as an
uncommitted tail, keeping its identity, term and vote, and the cluster loses nothing committed.
The schedule's `torn_write` fault draws the same fault in the CI sweep (test_house.py); this
scripts it on a follower and on the leader, with the invariants checked throughout.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.house.cluster import House, quiet_logs
from tests.house.scenarios import leader_of
from tests.house.sim import run


@pytest.mark.parametrize("victim, at", [("follower", 0.5), ("leader", 0.05), ("follower", 1.0)])
def test_a_torn_append_is_discarded_on_restart_and_nothing_committed_is_lost(
        victim: str, at: float, caplog: pytest.LogCaptureFixture) -> None:
    quiet_logs()
    caplog.set_level(logging.WARNING, logger="dpeer.statemachine")
    seen: dict[str, object] = {}

    async def tear_one(house: House) -> None:
        await asyncio.sleep(1.5)  # trained and committed writes for a while
        leader = leader_of(house)
        assert leader is not None, "no leader after boot"
        nid = leader if victim == "leader" else next(n for n in house.up() if n != leader)
        store = house.boxes[nid].daemon.store
        before = (store.uid, store.current_term, store.voted_for, store.last_index)
        index, offset = await house.tear(nid, at)
        await asyncio.sleep(0.3)
        house.start(nid)
        store = house.boxes[nid].daemon.store
        seen["torn"] = index == before[3] + 1 and offset > 0
        seen["before"], seen["after"] = before, (store.uid, store.current_term, store.voted_for, store.last_index)
        seen["aside"] = store.recovered_from

    result = run(1, seconds=5.0, scenario=tear_one)
    assert result.violation is None, result.violation
    assert seen["torn"] and seen["aside"] is None
    assert seen["after"] == seen["before"], "the store keeps its identity, hard state and log, less the torn entry"
    assert any("torn by a write cut short" in r.message for r in caplog.records)
