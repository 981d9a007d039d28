"""The trainer's state as the heal takes it (model, optimizer, step), for heal tests in and out of process."""

from __future__ import annotations

import torch

from dpeer.trainer import state as st


class State:
    """The trainer's view of its state, as the loop gives it to the heal."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
        self.model, self.opt, self.step = model, opt, step

    def parts(self) -> st.StateParts:
        return st.capture_parts(self.model, self.opt, step=self.step)

    def targets(self, header: dict) -> list[torch.Tensor]:
        return st.receive_targets(header, self.model, self.opt)

    def digest_order(self, header: dict, targets: list[torch.Tensor]) -> list[int] | None:
        return st.digest_order(header, targets, self.model)

    def load(self, parts: st.StateParts) -> None:
        self.step = st.restore_parts(parts, self.model, self.opt)[0]

    def digest(self) -> str:
        return st.params_digest(self.model)

    def optimizer_digest(self) -> str:
        return st.flatten(st.capture_parts(torch.nn.Sequential(), self.opt)).payload_digest()
