"""A paused worker (an empty view) waits with no idle limit, and the limit counts from the pause's
end: a box left out of the view that resumes training is not given up at once."""

from __future__ import annotations

import time

import torch

from dpeer.address import Address
from dpeer.channel.local import Assignment
from dpeer.trainer.loop import LoopConfig, Trainer, TrainSpec
from dpeer.trainer.stepping import Reduction
from dpeer.view import View

IDLE = 0.3
STORE = Address("127.0.0.1", 1)


class ScriptedViews:
    """Hands each view once the previous one has waited `hold` seconds of wait_view calls."""

    def __init__(self, views: list[tuple[View, float]]) -> None:
        self.views, self.handed_at, self.events = views, {}, []
        self._since: float | None = None

    def wait_view(self, after: int, timeout: float) -> Assignment | None:
        now = time.monotonic()
        for view, hold in self.views:
            if view.generation > after:
                if self._since is None or now - self._since >= hold:
                    self._since = self.handed_at[view.generation] = now
                    return Assignment(view, 0, "", "127.0.0.1")
                break
        time.sleep(timeout)  # what the real source does: block until a view or the timeout
        return None

    def report_failure(self, *args, **kwargs) -> None:
        self.events.append("failure")

    def report_progress(self, *args) -> None:
        self.events.append("progress")

    def report_speed(self, micro_batches_per_s: float) -> None:
        pass

    def report_event(self, kind: str, **fields) -> None:
        self.events.append(kind)


def trainer(source: ScriptedViews) -> Trainer:
    model = torch.nn.Linear(2, 1)
    data = [(torch.zeros(2), torch.zeros(1)) for _ in range(8)]
    spec = TrainSpec(model, torch.optim.SGD(model.parameters(), 0.1), data, lambda o, t: ((o - t) ** 2).sum(), 4, 4,
                     10, 0)
    return Trainer(spec, source, "me", LoopConfig(idle_limit=IDLE, view_wait=0.02, reduction=Reduction.FAST))


def test_the_idle_limit_counts_from_the_end_of_a_pause() -> None:
    # paused for twice the idle limit, then a view resumes training without this box
    source = ScriptedViews([(View(2, (), STORE), 0.0), (View(3, ("other",), STORE), 2 * IDLE)])
    try:
        trainer(source).run()
        raise AssertionError("a worker in no view must give up after its idle limit")
    except TimeoutError:
        ended = time.monotonic()
    assert "paused" in source.events and "progress" not in source.events  # a pause is no committed step
    assert ended - source.handed_at[3] >= IDLE, "given up before a full idle limit after the pause ended"
