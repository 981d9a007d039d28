"""A WorkerEvents that records what a worker supervisor told it, for tests without a daemon."""

from __future__ import annotations

from dpeer.daemon.decide.checkpoints import Held
from dpeer.daemon.decide.failures import FailureReport


class WorkerEventLog:
    """dpeer.daemon.worker.supervisor.WorkerEvents, kept in lists."""

    def __init__(self) -> None:
        self.failures: list[tuple[int, FailureReport]] = []
        self.checkpoints: list[Held] = []
        self.pids: list[int] = []

    def worker_failed(self, generation: int, report: FailureReport) -> None:
        """Keep the failure."""
        self.failures.append((generation, report))

    def checkpoint_written(self, held: Held) -> None:
        """Keep the checkpoint."""
        self.checkpoints.append(held)

    def worker_spawned(self, pid: int) -> None:
        """Keep the pid."""
        self.pids.append(pid)
