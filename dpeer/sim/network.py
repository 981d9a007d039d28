"""Per-link behaviour of the simulated network: delay, loss, one-way and two-way partitions."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class LinkPolicy:
    """How messages from one node to another behave; the default applies to unnamed links."""

    loss: float = 0.0
    delay_min: float = 0.0005
    delay_max: float = 0.002
    blocked: bool = False


class SimNetwork:
    """Decides, with a seeded RNG, whether and when a message crosses a directed link."""

    def __init__(self, rng: random.Random, default: LinkPolicy | None = None) -> None:
        self._rng = rng
        self.default = default or LinkPolicy()
        self._links: dict[tuple[str, str], LinkPolicy] = {}
        self._blocked: set[tuple[str, str]] = set()

    def link(self, src: str, dst: str) -> LinkPolicy:
        """The policy of the directed link src -> dst (a copy of the default until changed)."""
        return self._links.get((src, dst), self.default)

    def set_link(self, src: str, dst: str, policy: LinkPolicy) -> None:
        """Give the directed link src -> dst its own delay and loss."""
        self._links[(src, dst)] = policy

    def set_loss(self, loss: float) -> None:
        """Set the loss rate of the default link and every named link."""
        if not 0.0 <= loss <= 1.0:
            raise ValueError(f"loss must be within [0, 1], got {loss}")
        self.default.loss = loss
        for policy in self._links.values():
            policy.loss = loss

    def block(self, src: str, dst: str) -> None:
        """Drop every message src -> dst (a one-way partition)."""
        self._blocked.add((src, dst))

    def unblock(self, src: str, dst: str) -> None:
        """Undo block(src, dst)."""
        self._blocked.discard((src, dst))

    def partition(self, *groups: list[str] | set[str], one_way: bool = False) -> None:
        """Cut every link between different groups; one_way cuts only from earlier to later groups."""
        for i, a in enumerate(groups):
            for j, b in enumerate(groups):
                if i == j or (one_way and j < i):
                    continue
                for src in a:
                    for dst in b:
                        self.block(src, dst)

    def heal(self) -> None:
        """Remove every partition (loss and delay settings stay)."""
        self._blocked.clear()

    @property
    def partitioned(self) -> bool:
        """True while any link is cut by a partition."""
        return bool(self._blocked)

    def is_blocked(self, src: str, dst: str) -> bool:
        """True when src -> dst is cut by a partition."""
        return (src, dst) in self._blocked

    def route(self, src: str, dst: str) -> float | None:
        """The delay of one message src -> dst, or None when it is lost or cut."""
        if (src, dst) in self._blocked:
            return None
        policy = self.link(src, dst)
        if policy.blocked or (policy.loss and self._rng.random() < policy.loss):
            return None
        return self._rng.uniform(policy.delay_min, policy.delay_max)
