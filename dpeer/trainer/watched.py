"""The loop's collectives under the collective watch (collective_watch.py), for a Gloo group.

Each collective of a step (the gradients' sums, the carried rows, an evaluation) is armed with the
step's patience; a heal's with ``drops_only``, since a big heal may rightly run long. The watch's
thread also cuts a group whose data-plane port strangers flood, and notes each cut here, so the
failure it causes says why.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from dpeer.trainer.collective_watch import CollectiveWatch, Intrusion
from dpeer.trainer.group import GroupSeat

if TYPE_CHECKING:
    from dpeer.trainer.loop import Trainer

FOREIGN_LIMIT = 64  # strangers' connections on the data-plane port that make the group re-form (closing them)


class Watched:
    """A trainer's watch. watch: the watch's thread (None for NCCL, and before start()); cut: its
    last cut (generation, seconds overdue, why), taken by the failure it causes."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.watch: CollectiveWatch | None = None
        self.cut: tuple[int, float, str] | None = None

    def start(self) -> None:
        """Start the watch's thread for a Gloo group (steps() does, once)."""
        if self.trainer.group.backend == "gloo":
            self.watch = CollectiveWatch(self._newer_members, self._on_cut, self._intruded)

    def arm(self, m: GroupSeat) -> None:
        """A collective of the group ``m`` starts now; disarm() when it ends (a plain call, not a
        context: a generator context costs the step ~0.5 %)."""
        if self.watch is not None:
            self.watch.arm(m.generation, m.members, self.trainer.pace.patience(), self.trainer.group.cutter())

    def disarm(self) -> None:
        """The collective armed ended."""
        if self.watch is not None:
            self.watch.disarm()

    @contextmanager
    def healing(self, m: GroupSeat) -> Iterator[None]:
        """Run a heal's collectives under the watch: only a newer view that drops a member cuts them,
        once they have run a step's patience (a big heal may rightly run long)."""
        if self.watch is None:
            yield
            return
        self.watch.arm(m.generation, m.members, self.trainer.pace.patience(), self.trainer.group.cutter(),
                       drops_only=True)
        try:
            yield
        finally:
            self.watch.disarm()

    def take_cut(self, generation: int) -> tuple[int, float, str] | None:
        """The watch's cut of ``generation``, if it made one; any cut noted is forgotten."""
        cut, self.cut = self.cut if self.cut is not None and self.cut[0] == generation else None, None
        return cut

    def close(self) -> None:
        """Stop the watch's thread."""
        if self.watch is not None:
            self.watch.close()

    def _newer_members(self, generation: int) -> tuple[str, ...] | None:
        """The members of the newest committed view after ``generation`` (the watch's thread)."""
        newer = self.trainer.source.wait_view(generation, 0.0)
        return None if newer is None else tuple(newer.view.members)

    def _intruded(self) -> Intrusion | None:
        """The current group, when strangers opened FOREIGN_LIMIT connections to its data-plane port
        (Gloo's listener keeps them all until the group goes, then the process dies of too many
        open files): cut, it is reported and re-formed, and destroying it closes them (the watch's thread)."""
        group = self.trainer.group
        m, count = group.membership, group.foreign_connections()
        if m is None or count < FOREIGN_LIMIT:
            return None
        return Intrusion(m.generation, f"{count} connections from outside the group to its data-plane port",
                         group.cutter())

    def _on_cut(self, generation: int, overdue: float, why: str) -> None:
        """The watch cuts this generation's overdue collective (its thread): the failure it causes says so."""
        self.cut = (generation, overdue, why)
