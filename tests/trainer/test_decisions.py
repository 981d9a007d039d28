import pytest

from dpeer.trainer.decisions import collective_timeout, plan_heal, should_switch


def _covers(ranges, n):
    pos = 0
    for _, a, b in ranges:
        assert a == pos and b > a
        pos = b
    return pos == n


@pytest.mark.parametrize(
    "steps,n_chunks,max_step,donors,receivers",
    [
        ({0: 5, 1: 5, 2: 5}, 4, 5, [0, 1, 2], []),
        ({0: 5, 1: 3, 2: 5}, 4, 5, [0, 2], [1]),
        ({0: 0, 1: 9, 2: 0}, 3, 9, [1], [0, 2]),
        ({0: 7}, 8, 7, [0], []),
        ({0: 2, 1: 2, 2: 2, 3: 0, 4: 1}, 6, 2, [0, 1, 2], [3, 4]),
    ],
)
def test_plan_heal_table(steps, n_chunks, max_step, donors, receivers):
    plan = plan_heal(steps, n_chunks)
    assert plan.max_step == max_step
    assert plan.donors == donors
    assert plan.receivers == receivers
    assert plan.needed == bool(receivers)
    assert plan.reason
    for recv in receivers:
        ranges = plan.assignment[recv]
        assert _covers(ranges, n_chunks)
        assert all(d in donors for d, _, _ in ranges)


def test_plan_heal_spreads_over_donors_and_rotates():
    plan = plan_heal({0: 4, 1: 4, 2: 4, 3: 1, 4: 1}, n_chunks=6)
    first = plan.assignment[3]
    second = plan.assignment[4]
    assert {d for d, _, _ in first} == {0, 1, 2}
    assert first[0][0] != second[0][0]
    assert [b - a for _, a, b in first] == [2, 2, 2]


def test_plan_heal_fewer_chunks_than_donors_and_max_donors():
    plan = plan_heal({0: 3, 1: 3, 2: 3, 3: 0}, n_chunks=2)
    assert len(plan.assignment[3]) == 2
    plan = plan_heal({0: 3, 1: 3, 2: 3, 3: 0}, n_chunks=9, max_donors=1)
    assert plan.assignment[3] == [(0, 0, 9)]


@pytest.mark.parametrize("bad", [({}, 1), ({0: 1}, 0)])
def test_plan_heal_rejects(bad):
    with pytest.raises(ValueError):
        plan_heal(*bad)


@pytest.mark.parametrize(
    "current,seen,switch,target",
    [
        (3, [3, 3, 3], False, 3),
        (3, [3, 4, 3], True, 4),
        (3, [5, 4, 3], True, 5),
        (3, [2, 3], False, 3),
        (3, [], False, 3),
    ],
)
def test_should_switch_table(current, seen, switch, target):
    d = should_switch(current, seen)
    assert (d.switch, d.target) == (switch, target)
    assert d.reason


@pytest.mark.parametrize(
    "times,kwargs,expected",
    [
        ([], {}, 30.0),
        ([0.01] * 4, {"initial": 12.0}, 12.0),
        ([0.01] * 50, {}, 2.0),
        ([1.0] * 50, {}, 5.0),
        ([0.01] * 99 + [3.0], {}, 5 * 0.01),
        ([0.5] * 10, {"mult": 3.0, "floor": 0.1}, 1.5),
        ([100.0] * 10, {"ceiling": 60.0}, 60.0),
    ],
)
def test_collective_timeout_table(times, kwargs, expected):
    seconds, reason = collective_timeout(times, **kwargs)
    if expected < 2.0 and kwargs.get("floor", 2.0) == 2.0:
        expected = 2.0
    assert seconds == pytest.approx(expected)
    assert reason


def test_collective_timeout_uses_p99_of_window():
    times = [0.01] * 90 + [1.0] * 10
    seconds, _ = collective_timeout(times, floor=0.0, mult=2.0)
    assert seconds == pytest.approx(2.0)
    seconds, _ = collective_timeout(times + [0.01] * 200, floor=0.0, mult=2.0, window=200)
    assert seconds == pytest.approx(0.02)
