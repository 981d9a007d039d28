"""The box's compute speed (trainer/pace.py): folded pass by pass, reported to the daemon after a
warm-up, then only when it moved by more than SPEED_MOVE and SPEED_REPORT_EVERY passes on, never
for a pass that ran nothing."""

from __future__ import annotations

from types import SimpleNamespace

from dpeer.trainer.pace import SPEED_MOVE, SPEED_REPORT_EVERY, SPEED_WARMUP, Pace


def pace() -> tuple[Pace, list[float]]:
    reported: list[float] = []
    source = SimpleNamespace(report_speed=reported.append)
    return Pace(SimpleNamespace(cfg=SimpleNamespace(init_timeout=30.0), source=source)), reported


def test_the_speed_is_reported_after_the_warm_up_then_only_when_it_moved() -> None:
    p, reported = pace()
    for _ in range(SPEED_WARMUP - 1):
        p.computed(0.5, 4)  # 8 micro-batches a second
    assert reported == []
    p.computed(0.5, 4)
    assert reported == [8.0]
    for _ in range(SPEED_REPORT_EVERY - 1):
        p.computed(5.0, 4)  # ten times slower: moved, but too soon after the last report
    assert reported == [8.0]
    p.computed(5.0, 4)
    assert len(reported) == 2 and reported[-1] < 8.0 * (1 - SPEED_MOVE)
    for _ in range(10 * SPEED_REPORT_EVERY):
        p.computed(0.5 * (1 + SPEED_MOVE / 2), 4)  # settles near 7.3: within SPEED_MOVE of a report
    settled = len(reported)
    for _ in range(3 * SPEED_REPORT_EVERY):
        p.computed(0.5 * (1 + SPEED_MOVE / 2), 4)
    assert len(reported) == settled, "a speed that holds is not reported again"
    for _ in range(5 * SPEED_REPORT_EVERY):
        p.computed(1.0, 4)  # half as fast
    assert len(reported) <= settled + 3 and abs(reported[-1] - 4.0) < 4.0 * SPEED_MOVE


def test_a_pass_that_ran_nothing_measures_nothing() -> None:
    p, reported = pace()
    for _ in range(10):
        p.computed(0.2, 0)
        p.computed(0.0, 3)
    assert p.speed == 0.0 and reported == []
