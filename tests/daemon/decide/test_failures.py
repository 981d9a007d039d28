"""Table tests of the pure failure decisions (daemon/decide/failures.py): folding, the group's streak
of a failing step, each box's streak of failing builds and the rule that halts a job on them."""

from __future__ import annotations

import pytest

from dpeer.daemon.decide.failures import (
    BuildVerdict, FailurePhase, FailureReport, LastFailure, Streak, fold, judge_build, judge_failure, note_failure,
    reform_delay,
)

TRAIN, BUILD, GROUP = FailurePhase.TRAIN, FailurePhase.BUILD, FailurePhase.GROUP


@pytest.mark.parametrize("first, second", [
    ("MemoryError: tried to allocate 2.00 GiB; 512 MiB free", "MemoryError: tried to allocate 2.00 GiB; 415 MiB free"),
    ("RuntimeError: lock held (pid 4242)", "RuntimeError: lock held (pid 17)"),
    ("OSError: cannot reach 10.0.0.7:29500", "OSError: cannot reach 192.168.1.20:41234"),
    ("ValueError: bad tensor at 0x7f3a2c1b40d0", "ValueError: bad tensor at 0x55d1e2a3f010"),
    ("KeyError: 'run-3f2a9c1d'", "KeyError: 'run-0b77e41a'"),
    ("TimeoutError: waited 12.5s at 10:32:01", "TimeoutError: waited 9.75s at 11:02:59"),
    ("IndexError: index 7 is out of bounds", "IndexError:  index 12 is out\nof bounds"),
])
def test_errors_that_differ_only_in_figures_fold_to_one_signature(first: str, second: str) -> None:
    assert fold(first) == fold(second)


@pytest.mark.parametrize("first, second", [
    ("ValueError: boom", "TypeError: boom"),
    ("MemoryError: 512 MiB free", "MemoryError: 512 GiB free"),
    ("ModuleNotFoundError: No module named 'numpy'", "ModuleNotFoundError: No module named 'scipy'"),
])
def test_errors_that_differ_in_words_stay_apart(first: str, second: str) -> None:
    assert fold(first) != fold(second)


def train(error: str, generation: int, step: int = 0, node: str = "a") -> FailureReport:
    return FailureReport(node, TRAIN, step, error, generation)


def test_a_step_failing_with_a_changing_figure_halts_after_the_limit() -> None:
    streak = Streak()
    halts = []
    for generation, free in enumerate((512, 497, 388), start=1):
        verdict = judge_failure(streak, train(f"MemoryError: {free} MiB free", generation), 3)
        streak = verdict.streak
        halts.append(verdict.halt)
    assert halts == [False, False, True]
    assert "MemoryError: 388 MiB free" in verdict.reason and "3 times in a row" in verdict.reason


@pytest.mark.parametrize("reports, halt", [
    # two boxes of one group report the same generation: one attempt
    ([train("E: x", 1, node="a"), train("E: x", 1, node="b"), train("E: x", 2)], False),
    # another step is another failure: the streak restarts
    ([train("E: x", 1, step=3), train("E: x", 2, step=4), train("E: x", 3, step=4)], False),
    # a peer's failure in between does not break the streak
    ([train("E: x", 1), FailureReport("b", GROUP, 0, "reset", 2), train("E: x", 3), train("E: x", 4)], True),
    # another error restarts it
    ([train("E: x", 1), train("F: y", 2), train("E: x", 3)], False),
])
def test_the_groups_streak(reports: list[FailureReport], halt: bool) -> None:
    streak, verdict = Streak(), None
    for report in reports:
        verdict = judge_failure(streak, report, 3)
        streak = verdict.streak
    assert verdict is not None and verdict.halt is halt


def build(node: str, start: int, error: str = "ModuleNotFoundError: No module named 'x'") -> FailureReport:
    return FailureReport(node, BUILD, 0, error, start)


def builds(reports: list[FailureReport], boxes: dict[str, bool], limit: int = 3) -> BuildVerdict:
    streaks: dict[str, Streak] = {}
    verdict = None
    for report in reports:
        verdict = judge_build(streaks, report, boxes, limit)
        streaks = dict(verdict.streaks)
    assert verdict is not None
    return verdict


@pytest.mark.parametrize("reports, boxes, halt, kept_out", [
    # one box that cannot build, beside one that trains: kept out, no halt
    ([build("b", 1), build("b", 2), build("b", 3)], {"a": True, "b": False}, False, {"b"}),
    # the only box: nothing can train, halt
    ([build("a", 1), build("a", 2), build("a", 3)], {"a": False}, True, {"a"}),
    # every box fails: halt once the last one reaches the limit
    ([build(n, s) for s in (1, 2, 3) for n in ("a", "b")], {"a": False, "b": False}, True, {"a", "b"}),
    ([build(n, s) for s in (1, 2, 3) for n in ("a", "b")][:-1], {"a": False, "b": False}, False, {"a"}),
    # a box still building (no report yet) may yet train: no halt
    ([build("a", 1), build("a", 2), build("a", 3)], {"a": False, "b": False}, False, {"a"}),
    # a dead box that had built could come back and train: no halt
    ([build("a", 1), build("a", 2), build("a", 3)], {"a": False, "b": True}, False, {"a"}),
    # a box not yet a member reports: it counts as a box that could train
    ([build("c", 1), build("c", 2), build("c", 3)], {"a": False}, False, {"c"}),
    # the same start reported twice (a retried report) counts once
    ([build("a", 1), build("a", 1), build("a", 2)], {"a": False}, False, set()),
    # a build error whose PID differs on each start is still the same failure
    ([build("a", s, f"RuntimeError: lock held (pid {p})") for s, p in ((1, 311), (2, 402), (3, 517))],
     {"a": False}, True, {"a"}),
    # another error restarts the box's streak
    ([build("a", 1), build("a", 2, "ImportError: cannot import name 'y'"), build("a", 3)], {"a": False}, False, set()),
])
def test_a_failed_build_keeps_its_box_out_and_halts_only_when_no_box_can_train(
        reports: list[FailureReport], boxes: dict[str, bool], halt: bool, kept_out: set[str]) -> None:
    verdict = builds(reports, boxes)
    assert verdict.halt is halt, verdict.reason
    assert set(verdict.kept_out) == kept_out


def test_a_kept_out_box_says_who_trains_without_it_and_a_halt_names_every_box() -> None:
    kept = builds([build("b", 1), build("b", 2), build("b", 3)], {"a": True, "b": False})
    assert "b is kept out of the group; a can train without it" in kept.reason
    assert "building the job on b" in kept.reason and "3 times in a row" in kept.reason
    halted = builds([build(n, s) for s in (1, 2, 3) for n in ("a", "b")], {"a": False, "b": False})
    assert "no box can build it: a, b" in halted.reason and "3 times in a row" in halted.reason


def test_a_box_that_built_since_drops_its_streak() -> None:
    first = builds([build("b", 1), build("b", 2), build("b", 3)], {"a": True, "b": False})
    # b built the job (its record says ready), then a's build fails: b's old streak goes
    later = judge_build(first.streaks, build("a", 7), {"a": False, "b": True}, 3)
    assert set(later.streaks) == {"a"} and not later.kept_out and not later.halt


def test_the_reporter_counts_as_not_built_whatever_its_older_record_says() -> None:
    verdict = builds([build("a", 1), build("a", 2), build("a", 3)], {"a": True})
    assert verdict.halt, verdict.reason


def test_the_last_failure_counts_reports_of_one_signature_and_ignores_a_peers() -> None:
    last: LastFailure | None = None
    for generation, free in enumerate((512, 497), start=1):
        last = note_failure(last, train(f"MemoryError: {free} MiB free", generation))
    last = note_failure(last, FailureReport("b", GROUP, 0, "connection reset", 3))
    assert last is not None and last.repeats == 2
    assert last.as_status() == {"phase": "train", "step": 0, "error": "MemoryError: 497 MiB free", "repeats": 2}
    last = note_failure(last, train("ValueError: boom", 4))
    assert last is not None and last.repeats == 1
    assert note_failure(None, FailureReport("b", GROUP, 0, "reset", 1)) is None


@pytest.mark.parametrize("failures, delay", [(0, 0.5), (1, 0.5), (2, 1.0), (3, 2.0), (6, 10.0)])
def test_reform_delay_doubles_up_to_the_cap(failures: int, delay: float) -> None:
    assert reform_delay(failures, 0.5) == delay
