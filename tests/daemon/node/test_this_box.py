"""ThisBox's speed class: from its worker's latest speed, held near the committed class (hysteresis);
the units of a step the leader plans shares over; and the near peers its record names."""

from __future__ import annotations

from types import SimpleNamespace

from dpeer.daemon.config import TrainingConfig
from dpeer.daemon.node.this_box import ThisBox
from dpeer.daemon.serve.admission import MAX_NEAR, check_site
from dpeer.statemachine.state import MemberStatus
from dpeer.transport.calls import JoinRequest


def _box(committed: int | None, speed: float | None, worker: bool = True, by_speed: bool = True) -> ThisBox:
    me = SimpleNamespace(speed_class=committed)
    node = SimpleNamespace(id="n1", reads=SimpleNamespace(state=SimpleNamespace(members={"n1": me})))
    return ThisBox(node, SimpleNamespace(speed=speed) if worker else None, "", by_speed)  # type: ignore[arg-type]


def test_the_box_s_speed_class_follows_its_worker_and_holds_near_the_committed_one() -> None:
    assert _box(None, 16.0).speed_class() == 16  # 16 micro-batches a second: 4 * log2(16)
    assert _box(16, 2 ** (16.55 / 4)).speed_class() == 16  # past the rounding boundary, within the hold
    assert _box(None, 2 ** (16.55 / 4)).speed_class() == 17
    assert _box(16, 8.0).speed_class() == 12  # twice as slow: moves at once


def test_a_box_whose_worker_reported_no_speed_keeps_its_committed_class() -> None:
    assert _box(12, None).speed_class() == 12  # a restarted worker has not measured yet
    assert _box(None, None).speed_class() is None
    assert _box(None, None, worker=False).speed_class() is None  # no job


def test_a_box_whose_split_is_even_tells_no_speed_class() -> None:
    assert _box(12, 16.0, by_speed=False).speed_class() is None  # training.split: even


def test_the_leader_plans_shares_over_micro_batches_in_exact_mode_and_samples_in_fast_mode() -> None:
    assert TrainingConfig(global_batch=64, micro_batch=16).step_units == 4
    assert TrainingConfig(global_batch=64, micro_batch=16, reduction="fast").step_units == 64


def _measuring(members: dict[str, tuple[str, tuple[str, ...]]], samples: dict[str, list[float]]) -> ThisBox:
    """A box n1 with no configured site: members maps a node id to (its committed status, its near)."""
    state = SimpleNamespace(members={n: SimpleNamespace(status=MemberStatus(s), near=near)
                                     for n, (s, near) in members.items()})
    node = SimpleNamespace(id="n1", reads=SimpleNamespace(state=state),
                           probes=SimpleNamespace(recent_ms=lambda: samples))
    return ThisBox(node, None, "")  # type: ignore[arg-type]


def test_the_box_s_near_peers_are_its_active_members_only() -> None:
    """A peer committed dead or left, or never a member, is no link to judge: kept, the record named
    every id the box ever measured near, for good (through restarts: no sample keeps what was)."""
    box = _measuring({"n1": ("active", ("n2", "old")), "n2": ("active", ()), "old": ("dead", ()),
                      "gone": ("left", ())}, {"n2": [1.0], "old": [1.0], "gone": [1.0], "stranger": [1.0]})
    assert box.site() == ("", ("n2",))


def test_a_box_in_a_lan_of_thousands_names_no_more_near_peers_than_a_join_may() -> None:
    """Over MAX_NEAR near peers the leader refuses the box's record (BadRequest), and after
    REFUSALS_TO_STOP refusals the daemon stops itself: every box of a LAN of 1100 would."""
    ids = [f"n{i}" for i in range(1, 1101)]
    samples = {n: [0.5 + i / 1000] for i, n in enumerate(ids[1:])}
    box = _measuring({n: ("active", ()) for n in ids}, samples)
    site, near = box.site()
    assert len(near) == MAX_NEAR and list(near) == sorted(near)
    assert near == tuple(sorted(samples)[:MAX_NEAR])  # the smallest ids: the same on every box, whatever the jitter
    check_site(JoinRequest(node_id="n1", addr="h:1", near=near))  # the leader takes it
