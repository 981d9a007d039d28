"""A heal's collectives run under the collective watch: a donor that stops mid-heal (SIGSTOP, a cut
link) no longer holds the newcomer for the whole 30 s collective timeout once a newer view drops it.
The group and the heal are fakes here; the watch, its thread and the loop are the real ones."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from dpeer.address import Address
from dpeer.channel.local import Assignment
from dpeer.trainer import loop as loop_module
from dpeer.trainer.group import GroupSeat
from dpeer.trainer.loop import LoopConfig, Trainer, TrainSpec
from dpeer.trainer.stepping import Reduction
from dpeer.view import View

STORE = Address("127.0.0.1", 1)
NEVER_CUT_S = 5.0  # the fake heal gives up waiting for a cut after this long (a real one: the 30 s timeout)


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

    def destroy(self) -> None:
        pass

    def close(self) -> None:
        pass


class Views:
    """Generation 1 (me and a donor) at once; generation 2, without the donor, once the heal began."""

    def __init__(self) -> None:
        self.heal_began: float | None = None
        self.failures: list[tuple[float, str]] = []

    def wait_view(self, after: int, timeout: float) -> Assignment | None:
        if self.failures:
            raise Stop
        if after < 1:
            return Assignment(View(1, ("donor", "me"), STORE), 0, "", "127.0.0.1")
        if after < 2 and self.heal_began is not None:
            return Assignment(View(2, ("me",), STORE), 0, "", "127.0.0.1")
        time.sleep(min(timeout, 0.01))
        return None

    def report_failure(self, reason: str, generation: int, **fields) -> None:
        self.failures.append((time.monotonic(), reason))

    def report_progress(self, *args) -> None:
        pass


def test_a_heal_stuck_on_a_donor_that_a_newer_view_dropped_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    views, group = Views(), FakeGroup()

    def stuck_heal(*args, **kwargs):
        views.heal_began = time.monotonic()
        if not group.cut.wait(NEVER_CUT_S):
            raise RuntimeError("the heal waited for the donor until its timeout")
        raise RuntimeError("Connection closed by peer")  # what a cut Gloo receive raises

    monkeypatch.setattr(loop_module, "heal", stuck_heal)
    model = torch.nn.Linear(2, 1)
    data = [(torch.zeros(2), torch.zeros(1)) for _ in range(8)]
    spec = TrainSpec(model, torch.optim.SGD(model.parameters(), 0.1), data, lambda o, t: ((o - t) ** 2).sum(), 4, 4,
                     10, 0)
    trainer = Trainer(spec, views, "me", LoopConfig(init_timeout=0.8, reduction=Reduction.FAST, view_wait=0.01))
    trainer.group = group
    with pytest.raises(Stop):
        trainer.run()
    (at, reason), = views.failures
    assert "cut after" in reason and "drops donor" in reason, reason
    assert at - views.heal_began < NEVER_CUT_S / 2, "the heal was not cut: it waited for its timeout"
