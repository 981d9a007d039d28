"""Mixed speeds (daemon/decide/speeds.py): speed classes with hysteresis, shares planned from them."""

from __future__ import annotations

import math

import pytest

from dpeer.daemon.decide.speeds import FULL_SHARE, MIN_GAIN, plan_shares, speed_class, step_time, worth_resharing
from dpeer.statemachine.payloads import MAX_SPEED_CLASS, MIN_SPEED_CLASS
from dpeer.view import MAX_SHARE, valid_shares


@pytest.mark.parametrize("rate, klass", [
    (1.0, 0), (2.0, 4), (0.5, -4), (16.0, 16), (2 ** 0.25, 1),  # a class is a quarter octave
    (2 ** 0.125 * 1.001, 1), (2 ** 0.125 * 0.999, 0),  # rounded to the nearest class
    (2.0 ** 40, MAX_SPEED_CLASS), (2.0 ** -40, MIN_SPEED_CLASS),  # clamped to the records' range
])
def test_a_speed_class_is_a_quarter_octave(rate: float, klass: int) -> None:
    assert speed_class(rate, None) == klass


@pytest.mark.parametrize("exact, current, klass", [
    (4.55, 4, 4),  # past the rounding boundary, within HOLD: the class holds
    (3.45, 4, 4),
    (4.65, 4, 5),  # beyond HOLD: it moves
    (3.35, 4, 3),
    (4.55, 5, 5),  # the same speed from above holds the upper class: no flapping at a boundary
    (8.0, 4, 8),  # a big change moves at once
])
def test_a_speed_keeps_its_class_near_a_boundary(exact: float, current: int, klass: int) -> None:
    assert speed_class(2 ** (exact / 4), current) == klass


def test_a_speed_hovering_at_a_boundary_does_not_flap() -> None:
    klass, seen = None, []
    for exact in (4.4, 4.55, 4.45, 4.58, 4.42, 4.57):  # hovers around the 4|5 boundary at 4.5
        klass = speed_class(2 ** (exact / 4), klass)
        seen.append(klass)
    assert seen == [4] * 6


@pytest.mark.parametrize("rate", [0.0, -1.0, math.inf, math.nan])
def test_a_speed_must_be_finite_and_positive(rate: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        speed_class(rate, None)


@pytest.mark.parametrize("classes, shares, why", [
    ([8, 4], (8, 4), "fastest class 8"),  # twice as slow: half the share
    ([4, 8, 6], (4, 8, 6), "by speed class"),  # each quarter octave a step down (8 * 2**-0.5 = 5.66 -> 6)
    ([20, 0], (8, 1), "by speed class"),  # far slower: at least 1
    # unknown (an older build splits evenly whatever the view says): even for all
    ([8, None, 4], (), "1 member(s) of unknown speed (rank 1 first)"),
    ([5, 5, 5], (), "as fast as the fastest"),  # all equal: even
    ([5, None], (), "1 member(s) of unknown speed"),
    ([None, None], (), "2 member(s) of unknown speed"),
    ([], (), "as fast as the fastest"),
])
def test_shares_follow_the_speed_classes(classes: list[int | None], shares: tuple[int, ...], why: str) -> None:
    planned, reason = plan_shares(classes)
    assert planned == shares and why in reason
    assert valid_shares(planned, len(classes))


def test_shares_stay_within_a_views_weights() -> None:
    shares, _ = plan_shares([MAX_SPEED_CLASS, MIN_SPEED_CLASS, 0])
    assert shares == (FULL_SHARE, 1, 1) and FULL_SHARE <= MAX_SHARE


def test_a_step_s_predicted_time_is_its_slowest_member_s_units_over_its_speed() -> None:
    assert step_time(4, (), [8, 8]) == 2 / 4  # even: 2 micro-batches each at 4 a second
    assert step_time(4, (), [8, 4]) == 2 / 2  # the slow box (2 a second) holds the step
    assert step_time(6, (8, 4), [8, 4]) == 2 / 2  # 4 and 2: both take a second
    assert step_time(2, (8, 1), [8, 0]) == 1 / 1  # one micro-batch each whatever the shares


@pytest.mark.parametrize("units, current, planned, classes, worth, why", [
    (2, (), (8, 2), [8, 0], False, "1.00x"),  # two micro-batches on two boxes: 1 and 1 either way
    (16, (), (8, 4), [8, 4], True, "0.69x"),  # the slow box did 8 of 16, now 5: 2.75 s, not 4
    (16, (8, 4), (8, 5), [8, 5], False, "0.92x"),  # a class's wander moves one unit: less than MIN_GAIN
    (64, (8, 4), (8, 5), [8, 5], False, "0.98x"),
    (16, (8, 4), (), [8, None], True, "unknown"),  # an unknown speed goes even at once
    (16, (8, 4), (), [8, 8], True, "0.73x"),  # equal again: even
])
def test_a_change_of_the_shares_alone_is_worth_a_re_form_only_where_the_step_gets_faster(
        units: int, current: tuple[int, ...], planned: tuple[int, ...], classes: list[int | None], worth: bool,
        why: str) -> None:
    got, reason = worth_resharing(units, current, planned, classes)
    assert got is worth and why in reason, reason
    assert MIN_GAIN == 0.1


@pytest.mark.parametrize("current, planned", [
    ((), (8, 8, 8)),  # planned shares of three members for two: the prediction zipped two of the three counts
    ((8, 2), (8,)),
    ((8, 2, 1), (8, 2)),  # ... current ones of another length too
])
def test_shares_of_another_length_than_the_members_get_no_prediction(
        current: tuple[int, ...], planned: tuple[int, ...]) -> None:
    worth, reason = worth_resharing(4, current, planned, [0, -4])
    assert worth and "no prediction" in reason, reason
