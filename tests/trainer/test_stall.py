"""No silent stall (issue 35): a generation given up before it formed (a member sealed it
abandoned) that no newer view follows is reported as a group failure within the init timeout, so
the leader forms another; the worker does not sit at one step while the status says training."""

from __future__ import annotations

import time

import pytest
import torch

from dpeer.trainer.group import Superseded
from dpeer.trainer.loop import LoopConfig, Trainer, TrainSpec
from dpeer.trainer.stepping import Reduction
from dpeer.view import View
from tests.trainer.test_pause_idle import STORE, ScriptedViews

INIT = 0.3


class Reports(ScriptedViews):
    def __init__(self, views: list[tuple[View, float]]) -> None:
        super().__init__(views)
        self.failures: list[tuple[float, int, dict]] = []

    def report_failure(self, reason: str, generation: int, **fields) -> None:
        self.failures.append((time.monotonic(), generation, {"reason": reason, **fields}))


def test_a_generation_given_up_with_no_newer_view_is_reported_failed_within_the_init_timeout() -> None:
    source = Reports([(View(2, ("other", "me"), STORE, "s" * 32), 0.0)])
    model = torch.nn.Linear(2, 1)
    data = [(torch.zeros(2), torch.zeros(1)) for _ in range(8)]
    spec = TrainSpec(model, torch.optim.SGD(model.parameters(), 0.1), data, lambda o, t: ((o - t) ** 2).sum(), 4, 4,
                     10, 0)
    trainer = Trainer(spec, source, "me", LoopConfig(init_timeout=INIT, idle_limit=3.0, view_wait=0.02,
                                                     reduction=Reduction.FAST))
    formed_at: list[float] = []

    def abandoned(*args, **kwargs):
        formed_at.append(time.monotonic())
        raise Superseded("generation 2 was abandoned by a member before it formed")

    trainer.group.form = abandoned  # what a member that gave up on the rendezvous leaves the others with
    with pytest.raises(TimeoutError):
        trainer.run()
    assert len(source.failures) == 1, source.failures
    at, generation, fields = source.failures[0]
    assert generation == 2 and fields["phase"] == "group" and "given up before it formed" in fields["error"]
    assert INIT <= at - formed_at[0] < INIT + 1.0
