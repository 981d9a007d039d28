"""Table tests of the leader's checkpoint decision and the worker's resume plan (both pure)."""

from __future__ import annotations

import pytest

from dpeer.daemon.decide.checkpoints import Held, decide_checkpoint, quorum, still_pending, valid_digest
from dpeer.statemachine.entry import EntryKind
from dpeer.statemachine.payloads import CheckpointTaken
from dpeer.statemachine.state import Checkpoint, ClusterState, Member, MemberStatus
from dpeer.trainer.decisions import plan_resume
from dpeer.address import Address
from dpeer.view import View

A, B = "a" * 64, "b" * 64


def state(members: int = 3, committed: int = 0, view: bool = True) -> ClusterState:
    names = tuple(f"n{i}" for i in range(1, members + 1))
    ckpt = Checkpoint(committed, A, names) if committed else None
    return ClusterState(view=View(1, names, Address.parse("h:1")) if view else None, checkpoint=ckpt)


@pytest.mark.parametrize(
    "members, committed, reports, step, holders, why",
    [
        (3, 0, {"n1": Held(100, A), "n2": Held(100, A)}, 100, ["n1", "n2"], "2 of 3"),
        (3, 0, {"n1": Held(100, A)}, None, None, "held by 1 of the 2"),
        (3, 100, {"n1": Held(100, A), "n2": Held(100, A)}, None, None, "newer than the committed"),
        (3, 0, {"n1": Held(200, A), "n2": Held(100, A), "n3": Held(100, A)}, 100, ["n2", "n3"], "2 of 3"),
        (3, 0, {"n1": Held(100, A), "n2": Held(100, B), "n3": Held(100, A)}, 100, ["n1", "n3"], "diverged"),
        (3, 0, {"n1": Held(100, A), "n2": Held(100, B)}, None, None, "diverged"),
        (5, 0, {"n1": Held(100, A), "n2": Held(100, A)}, None, None, "of the 3"),
        (1, 0, {"n1": Held(100, A)}, 100, ["n1"], "1 of 1"),
        (4, 0, {"n1": Held(300, A), "n2": Held(300, A), "n3": Held(300, A)}, 300, ["n1", "n2", "n3"], "3 of 4"),
    ],
)
def test_decide_checkpoint(members, committed, reports, step, holders, why) -> None:
    d = decide_checkpoint(state(members, committed), reports)
    assert why in d.reason
    if step is None:
        assert not d.propose
    else:
        assert d.kind is EntryKind.CHECKPOINT
        assert d.proposal == CheckpointTaken(step, reports[holders[0]].digest, tuple(holders), False)


def test_no_view_no_checkpoint() -> None:
    d = decide_checkpoint(state(view=False), {"n1": Held(100, A)})
    assert not d.propose and "no group holds a checkpoint" in d.reason


def paused(*runners: str, jobless: tuple[str, ...] = (), dead: tuple[str, ...] = ()) -> ClusterState:
    """Training paused (an empty view); runners run the job's worker (a store port), jobless do not."""
    members = {n: Member(f"{n}:1", MemberStatus.ACTIVE, 1, 9) for n in runners}
    members |= {n: Member(f"{n}:1", MemberStatus.ACTIVE, 1) for n in jobless}
    members |= {n: Member(f"{n}:1", MemberStatus.DEAD, 1, 9) for n in dead}
    return ClusterState(members=members, view=View(2, (), Address.read("")))


def test_a_pause_that_raced_the_last_step_still_records_the_final_checkpoint() -> None:
    # the workers wrote the final checkpoint as the pause's empty view landed: the job must finish
    d = decide_checkpoint(paused("n1", "n2", "n3", jobless=("x",), dead=("y",)),
                          {"n1": Held(100, A, True), "n2": Held(100, A, True)})
    assert d.proposal == CheckpointTaken(100, A, ("n1", "n2"), True) and "2 of 3 members" in d.reason


def test_while_paused_a_majority_of_the_job_running_members_is_still_needed() -> None:
    d = decide_checkpoint(paused("n1", "n2", "n3", "n4"), {"n1": Held(100, A, True), "n2": Held(100, A, True)})
    assert not d.propose and "held by 2 of the 3" in d.reason
    d = decide_checkpoint(paused(jobless=("x",)), {"n1": Held(100, A)})  # quorum(0) is 1: nobody runs the job
    assert not d.propose and "no group holds a checkpoint" in d.reason


def test_quorum_and_pending_and_digest_shape() -> None:
    assert [quorum(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert still_pending({"a": Held(100, A), "b": Held(200, A)}, 100) == {"b": Held(200, A)}
    assert valid_digest(A) and not valid_digest("A" * 64) and not valid_digest(A[:-1]) and not valid_digest("")


@pytest.mark.parametrize(
    "local, committed, steps, verify, why",
    [
        ([100, 200], 0, [200, 100], 0, "no committed checkpoint"),
        ([], 0, [], 0, "no committed checkpoint"),
        ([100, 200, 300], 200, [200, 100], 200, "ignoring 1 newer"),
        ([100, 200], 200, [200, 100], 200, "committed checkpoint of step 200"),
        ([100], 200, [100], 200, "is not on this disk"),
        ([300, 400], 200, [], 200, "ignoring 2 newer"),
        ([200, 200, 100], 200, [200, 100], 200, "committed"),
    ],
)
def test_plan_resume(local, committed, steps, verify, why) -> None:
    plan = plan_resume(local, committed)
    assert plan.steps == steps and plan.verify_step == verify and why in plan.reason
