"""The box's compute speed (trainer/pace.py): folded pass by pass, reported to the daemon after a
warm-up and then only when it moved by more than SPEED_MOVE, never for a pass that ran nothing."""

from __future__ import annotations

from types import SimpleNamespace

from dpeer.trainer.pace import SPEED_MOVE, SPEED_WARMUP, Pace


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
    for _ in range(20):
        p.computed(0.5 * (1 + SPEED_MOVE / 2), 4)  # slower, but within SPEED_MOVE of the report
    assert reported == [8.0]
    for _ in range(20):
        p.computed(1.0, 4)  # half as fast
    assert len(reported) >= 2 and abs(reported[-1] - 4.0) < 4.0 * SPEED_MOVE


def test_a_pass_that_ran_nothing_measures_nothing() -> None:
    p, reported = pace()
    for _ in range(10):
        p.computed(0.2, 0)
        p.computed(0.0, 3)
    assert p.speed == 0.0 and reported == []
