"""Thousands of seeded chaos schedules: crashes, restarts, partitions (two-way and one-way),
loss and pauses with client proposals; safety is checked at every persisted Ready, liveness
after healing. A failure names its seed: run_schedule(seed, n) replays it exactly."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from raft_sim import DETECT_AFTER, election_times, run_schedule

from dpeer.peer.consensus import LAN

CHUNK = 50


def _run_chunk(start: int, count: int) -> None:
    for seed in range(start, start + count):
        n = (3, 5, 7)[seed % 3]
        try:
            run_schedule(seed, n)
        except AssertionError as exc:
            pytest.fail(f"seed {seed} (n={n}) failed: {exc}\n"
                        f"reproduce: run_schedule({seed}, {n}) from tests/consensus/raft_sim.py")


@pytest.mark.parametrize("start", range(0, 600, CHUNK))
def test_chaos_schedules_keep_raft_safe_and_live(start: int) -> None:
    _run_chunk(start, CHUNK)


@pytest.mark.slow
@pytest.mark.parametrize("start", range(600, 6000, 500))
def test_many_more_chaos_schedules(start: int) -> None:
    _run_chunk(start, 500)


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
