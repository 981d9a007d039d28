"""Thousands of seeded chaos schedules: crashes, restarts, restarts on wiped disks, partitions
(two-way and one-way), loss, pauses and misused force, with client proposals; and schedules of
a majority lost for good then forced back. Safety is checked at every persisted Ready (see
raft_checker.py), liveness after healing. A failure names its seed and the command replaying it."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from raft_schedules import election_times, replay_command, run_force_schedule, run_schedule
from raft_sim import DETECT_AFTER

from dpeer.consensus import LAN, RaftNode
from dpeer.consensus.election import Election

CHUNK = 50


def _run_chunk(start: int, count: int, force: bool = False, chaos_s: float = 1.0) -> None:
    for seed in range(start, start + count):
        n = (3, 5, 7)[seed % 3]
        try:
            if force:
                run_force_schedule(seed, n)
            else:
                run_schedule(seed, n, chaos_s, quiet_s=max(1.5, chaos_s))
        except AssertionError as exc:
            pytest.fail(f"seed {seed} (n={n}) failed: {exc}\nreplay: {replay_command(seed, n, force, chaos_s)}")


@pytest.mark.parametrize("start", range(0, 1500, CHUNK))
def test_chaos_schedules_keep_raft_safe_and_live(start: int) -> None:
    _run_chunk(start, CHUNK)


@pytest.mark.parametrize("start", range(0, 150, CHUNK // 2))
def test_a_majority_lost_for_good_is_forced_back_safely_and_misused_force_is_refused(start: int) -> None:
    _run_chunk(start, CHUNK // 2, force=True)


@pytest.mark.slow
@pytest.mark.parametrize("start", range(1500, 7500, 500))
def test_many_more_longer_chaos_schedules(start: int) -> None:
    _run_chunk(start, 500, chaos_s=2.0)


@pytest.mark.slow
@pytest.mark.parametrize("start", range(150, 750, 100))
def test_many_more_forced_recoveries(start: int) -> None:
    _run_chunk(start, 100, force=True)


def test_the_schedules_catch_a_planted_amnesia_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the identity checks planted away, a box back on a new disk takes messages meant for
    the store it replaced, its answers count, and it campaigns as that voter: some schedule
    must then break an invariant (a committed entry lost, two leaders in a term)."""
    step = RaftNode.step

    def amnesiac_admit(self: RaftNode, sender: object, msg: object) -> bool:
        self.heard[sender.node_id] = self.now
        return True

    monkeypatch.setattr(RaftNode, "step", lambda self, now, sender, msg, to_uid: step(self, now, sender, msg, self.uid))
    monkeypatch.setattr(RaftNode, "_admit", amnesiac_admit)
    monkeypatch.setattr(Election, "promotable", lambda self: self.node.id in self.node.membership.voters)
    for seed in range(400):
        try:
            run_schedule(seed, (3, 5, 7)[seed % 3])
        except AssertionError as exc:
            assert not str(exc).startswith(f"seed {seed}:"), f"a liveness failure, not a safety one: {exc}"
            return
    pytest.fail("no schedule caught a node answering for a store it is not")


def _stats(times: list[float]) -> tuple[float, float]:
    times = sorted(times)
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


def test_lan_preset_elects_a_new_leader_within_a_second_after_a_crash_of_a_busy_leader() -> None:
    busy = dataclasses.replace(LAN, idle_heartbeat_interval=0.0, idle_learner_heartbeat_interval=0.0,
                               idle_election_timeout=0.0)
    times = sorted(election_times(100, cfg=busy, detector=False))
    p50, p99 = _stats(times)
    print(f"election after a busy leader's crash, LAN, 5 nodes, 100 trials, no failure detector: "
          f"min {times[0]:.3f}s p50 {p50:.3f}s p99 {p99:.3f}s max {times[-1]:.3f}s")
    assert LAN.election_timeout_min - LAN.heartbeat_interval <= times[0] and p99 < 1.0


def test_an_idle_leaders_crash_is_repaired_within_a_second_through_the_failure_detector() -> None:
    times = sorted(election_times(100))
    p50, p99 = _stats(times)
    print(f"election after an idle leader's crash, LAN, 5 nodes, 100 trials, detector after "
          f"{DETECT_AFTER}s: min {times[0]:.3f}s p50 {p50:.3f}s p99 {p99:.3f}s max {times[-1]:.3f}s")
    assert DETECT_AFTER <= times[0] and p99 < 1.0


def test_without_the_failure_detector_an_idle_leader_is_replaced_after_the_idle_timeout() -> None:
    times = sorted(election_times(30, detector=False))
    print(f"election after an idle leader's crash, no detector: min {times[0]:.3f}s max {times[-1]:.3f}s")
    earliest = LAN.idle_election_timeout - LAN.idle_heartbeat_interval
    latest = 1.5 * LAN.idle_election_timeout + LAN.election_timeout_max
    assert earliest <= times[0] and times[-1] < latest
