"""This replica's training state as a heal and a checkpoint take it (heal.Healable).

The state is the job's (model, optimizers, scheduler, scaler), the trainer's step and its
stepper's reduction state, with the replica's lineage: the parameter digests at its recent
checkpoint steps, which the heal's tie-break compares when replicas at one step differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from dpeer.trainer import state as st
from dpeer.trainer.heal import HealProgress, HealSession

if TYPE_CHECKING:
    from dpeer.trainer.loop import Trainer

LINEAGE_KEPT = 8  # checkpoint digests a replica remembers of its lineage (for the heal's tie-break)


class Replica:
    """A trainer's state. lineage: checkpoint step -> parameter digest along this replica's lineage;
    session: a torn state from an interrupted heal, resumed by the next (``progress`` hears a long
    heal's progress)."""

    def __init__(self, trainer: Trainer, progress: Callable[[HealProgress], None]) -> None:
        self.trainer = trainer
        self.lineage: dict[int, str] = {}
        self.session = HealSession(progress)

    def parts(self) -> st.StateParts:
        """The full training state at the current step, its tensors live (a heal donor's view)."""
        t, s = self.trainer, self.trainer.spec
        parts = st.capture_parts(s.model, s.optimizer, s.scheduler, s.scaler, t.step, t.sampler.cursor_after(t.step))
        parts.header["reduction"] = t.stepper.state()
        parts.header["lineage"] = sorted(self.lineage.items())
        return parts

    def capture(self) -> st.StateBlob:
        """The full training state at the current step, in one buffer."""
        return st.flatten(self.parts())

    def targets(self, header: dict) -> list[torch.Tensor]:
        """Where a heal receives each tensor of a peer's state: this replica's own, where they fit."""
        s = self.trainer.spec
        return st.receive_targets(header, s.model, s.optimizer, s.scheduler, s.scaler)

    def digest_order(self, header: dict, targets: list[torch.Tensor]) -> list[int] | None:
        """Which received tensors digest() hashes, in its order, when all are received in place."""
        return st.digest_order(header, targets, self.trainer.spec.model)

    def load(self, parts: st.StateParts) -> None:
        """Replace the training state with received ``parts``."""
        t, s = self.trainer, self.trainer.spec
        t.step, _cursor = st.restore_parts(parts, s.model, s.optimizer, s.scheduler, s.scaler)
        self._take_header(parts.header)

    def apply(self, blob: st.StateBlob) -> None:
        """Replace the training state with ``blob`` (a checkpoint's): no torn heal is left to resume."""
        t, s = self.trainer, self.trainer.spec
        t.step, _cursor = st.restore(blob, s.model, s.optimizer, s.scheduler, s.scaler)
        self.session.forget()
        self._take_header(blob.header)

    def _take_header(self, header: dict) -> None:
        self.trainer.stepper.load_state(header.get("reduction"))
        self.lineage = {int(k): str(v) for k, v in header.get("lineage", [])}
        if header.get("params_digest"):
            self.remember(self.trainer.step, header["params_digest"])

    def remember(self, step: int, digest: str) -> None:
        """Note this replica's digest at a checkpoint step (its lineage), keeping the newest few."""
        self.lineage[step] = digest
        for old in sorted(self.lineage)[:-LINEAGE_KEPT]:
            del self.lineage[old]

    def vouches(self, step: int, digest: str) -> bool:
        """Whether this replica's lineage holds the committed checkpoint (``step`` > 0, ``digest``)."""
        return step > 0 and self.lineage.get(step) == digest

    def digest(self) -> str:
        """Digest of the model's parameters and buffers."""
        return st.params_digest(self.trainer.spec.model)
