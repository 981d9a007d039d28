"""What the Peer service serves from the rest of the daemon, as one typed value: the status
document, the leader's intake of the boxes' reports, the daemon's exit once its leave is
committed, and where the checkpoints it serves are."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dpeer.daemon.node.events import LeaderIntake


class StatusSource(Protocol):
    """The status document of this daemon (serve/status_report.py)."""

    def status(self) -> dict[str, Any]:
        """The whole document, as `dpeer status --json` prints it."""


class Lifecycle(Protocol):
    """The daemon's end (daemon.py)."""

    async def left(self) -> None:
        """This node's member_left is committed: the daemon exits."""


@dataclass(frozen=True)
class Backing:
    """The service's one dependency beside the node and the transport; see the module docstring."""

    status: StatusSource
    leader: LeaderIntake
    lifecycle: Lifecycle
    checkpoint_dir: Path
