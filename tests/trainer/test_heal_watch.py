"""A heal's collectives run under the collective watch: a donor that stops mid-heal (SIGSTOP, a cut
link) no longer holds the newcomer for the whole 30 s collective timeout once a newer view drops it,
and the failure is a group failure, which never counts towards judging the job broken; a newer view
that drops nobody (a join, a pause, a pause and resume) never cuts a heal, however long it runs.
The group and the heal are fakes here; the watch, its thread and the loop are the real ones; the
progress a donor reports is checked on heal._finish itself."""

from __future__ import annotations

import threading
import time
import types

import pytest
import torch

from dpeer.address import Address
from dpeer.channel.local import Assignment
from dpeer.trainer import heal as heal_module
from dpeer.trainer import loop as loop_module
from dpeer.trainer.group import GroupSeat
from dpeer.trainer.loop import LoopConfig, Trainer, TrainSpec
from dpeer.trainer.stepping import Reduction
from dpeer.view import View

STORE = Address("127.0.0.1", 1)
NEVER_CUT_S = 5.0  # the fake heal gives up waiting for a cut after this long (a real one: the 30 s timeout)
PAST_A_JOINS_PATIENCE = 1.2  # a step's collective would be cut by a join or a pause past 8 x 0.1 s


class Stop(Exception):
    """Ends the loop once the failure was reported."""


class FakeGroup:
    """A Gloo group whose cutter sets an event instead of shutting sockets."""

    backend, device = "gloo", torch.device("cpu")

    def __init__(self) -> None:
        self.cut, self.membership = threading.Event(), None

    def form(self, view: View, superseded, bind_host) -> GroupSeat:
        self.membership = GroupSeat(view.generation, view.members.index("me"), len(view.members), view.members)
        return self.membership

    def set_timeout(self, seconds: float) -> None:
        pass

    def cutter(self):
        return lambda: (self.cut.set(), 1)[1]

    def foreign_connections(self) -> int:
        return 0

    def destroy(self) -> None:
        pass

    def close(self) -> None:
        pass


class Views:
    """Generation 1 (me and a donor) at once; generation 2 (``then``) once the heal began."""

    def __init__(self, then: tuple[str, ...] = ("me",)) -> None:
        self.then = then
        self.heal_began: float | None = None
        self.failures: list[tuple[float, str, dict]] = []

    def wait_view(self, after: int, timeout: float) -> Assignment | None:
        if self.failures:
            raise Stop
        if after < 1:
            return Assignment(View(1, ("donor", "me"), STORE), 0, "", "127.0.0.1")
        if after < 2 and self.heal_began is not None:
            return Assignment(View(2, self.then, STORE), 0, "", "127.0.0.1")
        time.sleep(min(timeout, 0.01))
        return None

    def report_failure(self, reason: str, generation: int, **fields) -> None:
        self.failures.append((time.monotonic(), reason, fields))

    def report_progress(self, *args) -> None:
        pass

    def report_speed(self, micro_batches_per_s: float) -> None:
        pass


def run_stuck_heal(monkeypatch: pytest.MonkeyPatch, views: Views, give_up_s: float) -> FakeGroup:
    """Run the loop over a heal that blocks until the group is cut (then fails as a cut Gloo receive
    does, inside heal._finish) or until ``give_up_s`` (then fails as an ordinary timeout)."""
    group = FakeGroup()

    def stuck_heal(*args, **kwargs):
        views.heal_began = time.monotonic()
        cut = group.cut.wait(give_up_s)
        posted = heal_module._Posted([], {0: ([], [], [])}, [0], 1)
        heal_module._finish(Broken("Connection closed by peer" if cut else "Timed out"), posted,
                            heal_module.HealSession(), time.monotonic())

    monkeypatch.setattr(loop_module, "heal", stuck_heal)
    model = torch.nn.Linear(2, 1)
    data = [(torch.zeros(2), torch.zeros(1)) for _ in range(8)]
    spec = TrainSpec(model, torch.optim.SGD(model.parameters(), 0.1), data, lambda o, t: ((o - t) ** 2).sum(), 4, 4,
                     10, 0)
    trainer = Trainer(spec, views, "me", LoopConfig(reduction=Reduction.FAST, view_wait=0.01))
    trainer.group = group
    with pytest.raises(Stop):
        trainer.run()
    return group


class Broken:
    """A transfer whose next piece fails with ``error``."""

    layout = types.SimpleNamespace(n_pieces=1, total=1, piece_bytes=1)
    done: set = set()
    sent = 0

    def __init__(self, error: str) -> None:
        self.error = error

    def finish_piece(self, *args) -> None:
        raise RuntimeError(self.error)

    def drain(self, sends) -> None:
        pass

    def salvage(self, receives) -> None:
        pass


def test_a_heal_stuck_on_a_donor_that_a_newer_view_dropped_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    views = Views(then=("me",))
    run_stuck_heal(monkeypatch, views, NEVER_CUT_S)
    (at, reason, fields), = views.failures
    assert "cut after" in reason and "drops donor" in reason, reason
    assert at - views.heal_began < NEVER_CUT_S / 2, "the heal was not cut: it waited for its timeout"
    assert fields["phase"] == "group", fields  # transient: never a step towards halting the job


@pytest.mark.parametrize("then", [("donor", "me", "new"), ("donor", "me"), ()], ids=["join", "same members", "pause"])
def test_a_heal_is_not_cut_by_a_view_that_drops_nobody(monkeypatch: pytest.MonkeyPatch, then) -> None:
    views = Views(then=then)
    group = run_stuck_heal(monkeypatch, views, PAST_A_JOINS_PATIENCE)
    (_, reason, _), = views.failures
    assert not group.cut.is_set() and "cut after" not in reason, reason


class Sends:
    """A donor's transfer: each posted send completes after ``each`` seconds."""

    layout = types.SimpleNamespace(n_pieces=4, total=4000, piece_bytes=1000)
    done: set = set()
    sent = 4000

    def __init__(self, each: float) -> None:
        self.each = each

    def wait(self, work) -> None:
        time.sleep(self.each)


def test_a_donor_reports_the_progress_of_a_long_transfer() -> None:
    seen: list = []
    session = heal_module.HealSession(seen.append)
    posted = heal_module._Posted(["s1", "s2", "s3", "s4"], {}, [], 0)
    heal_module._finish(Sends(0.01), posted, session, time.monotonic() - 2 * heal_module.PROGRESS_AFTER_S)
    assert seen and seen[0].total_bytes == 4000 and seen[0].donors == 0 and 0 < seen[0].done_bytes <= 4000
