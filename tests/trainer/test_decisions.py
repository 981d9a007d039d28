import pytest

from dpeer.trainer.decisions import collective_timeout, pick_lineage, plan_heal, should_cut, should_switch


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


@pytest.mark.parametrize("steps, digests, vouched, donors, why", [
    # one lineage at the top step: its holders donate, nobody at it receives
    ({0: 5, 1: 5, 2: 3}, {0: "x", 1: "x", 2: "y"}, set(), [0, 1], "one lineage"),
    # two lineages at the top step: the one holding the committed checkpoint wins, even in a minority
    ({0: 5, 1: 5, 2: 5}, {0: "x", 1: "x", 2: "y"}, {2}, [2], "holds the committed checkpoint"),
    # no checkpoint vouches: the lineage most ranks at the step hold wins
    ({0: 5, 1: 5, 2: 5}, {0: "y", 1: "x", 2: "x"}, set(), [1, 2], "most ranks at the step hold it (2 of 3)"),
    # a tie: the lineage of the lowest rank wins
    ({0: 5, 1: 5, 2: 4, 3: 5}, {0: "y", 1: "x", 2: "x", 3: "x"}, set(), [1, 3], "most ranks"),
    ({0: 5, 1: 5}, {0: "y", 1: "x"}, set(), [0], "its lowest holder, rank 0, is the lowest rank"),
    # a lower step never wins, whatever vouches for it
    ({0: 5, 1: 4}, {0: "y", 1: "x"}, {1}, [0], "one lineage"),
])
def test_pick_lineage_table(steps, digests, vouched, donors, why):
    got, reason = pick_lineage(steps, digests, vouched)
    assert got == donors and why in reason, reason


def test_plan_heal_sends_the_winning_lineage_to_every_rank_apart_from_it():
    plan = plan_heal({0: 7, 1: 7, 2: 7, 3: 2}, n_chunks=2, digests={0: "b" * 64, 1: "a" * 64, 2: "a" * 64, 3: "c" * 64})
    assert (plan.max_step, plan.donors, plan.receivers) == (7, [1, 2], [0, 3])
    assert "2 lineages at step 7: aaaaaaaaaaaa on [1, 2] wins" in plan.reason
    assert all(sum(e - s for _, s, e in plan.assignment[r]) == 2 for r in plan.receivers)
    again = plan_heal({0: 7, 1: 7, 2: 7, 3: 7}, n_chunks=2, digests=dict.fromkeys(range(4), "a" * 64))
    assert not again.needed  # after the heal, one lineage: the group trains on instead of re-forming for ever


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


@pytest.mark.parametrize("members,newer,cut,reason", [
    (("a", "b", "c"), None, False, "no newer view"),
    (("a", "b", "c"), ("a", "b"), True, "drops c"),
    (("a", "b", "c"), ("a", "b", "d"), True, "drops c"),  # a replacement: c is still gone
    (("a", "b"), ("b", "a"), True, "same members"),  # re-formed in another rank order: their group failed
    (("a", "b"), ("a", "b", "c"), False, "only adds"),  # a join: the allreduce switches at a step boundary
    (("a", "b"), (), False, "pauses training"),  # an operator's pause: it too ends at a step boundary
])
def test_should_cut_table(members, newer, cut, reason):
    d = should_cut(members, newer)
    assert d.cut is cut and reason in d.reason


@pytest.mark.parametrize("overdue,cut", [(0.3, False), (0.8, True)])
def test_should_cut_a_joins_collective_only_far_past_its_patience(overdue, cut):
    assert should_cut(("a", "b"), ("a", "b", "c"), overdue, 0.1).cut is cut
    assert should_cut(("a", "b"), (), overdue, 0.1).cut is cut  # a pause: a switch at a step boundary too


@pytest.mark.parametrize("newer,cut,reason", [
    (("a",), True, "drops b"),  # a donor stopped or cut off: the heal cannot end
    (("a", "b", "c"), False, "drops no member"),  # a join waits for the heal, however long it runs
    (("b", "a"), False, "drops no member"),  # a pause then a resume re-forms the same members
    ((), False, "drops no member"),  # an operator's pause
])
def test_should_cut_a_heal_only_when_a_member_is_dropped(newer, cut, reason):
    d = should_cut(("a", "b"), newer, overdue=1000.0, patience=0.1, drops_only=True)
    assert d.cut is cut and reason in d.reason
