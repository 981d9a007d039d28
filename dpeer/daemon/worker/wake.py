"""Wakes the daemon's loop when its worker needs attention, so a training box's chores can run
once a second instead of polling the worker every 20-100 ms: the worker rings the doorbell
(dpeer.channel.local) after every report but a step's progress, and the kernel signals the worker's
exit through a pidfd.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable

from dpeer.channel.local import Doorbell

log = logging.getLogger("dpeer.worker")


class WorkerWake:
    """Calls on_ring() from the event loop on each doorbell ring, on_exit() when a watched pid exits."""

    def __init__(self, loop: asyncio.AbstractEventLoop, bell: Doorbell, on_ring: Callable[[], None],
                 on_exit: Callable[[], None]) -> None:
        self._loop, self._on_ring, self._on_exit = loop, on_ring, on_exit
        self._bell: Doorbell | None = bell
        self._exit_fds: set[int] = set()
        loop.add_reader(bell.fileno(), self._rang)

    @classmethod
    def start(cls, loop: asyncio.AbstractEventLoop, directory: str, on_ring: Callable[[], None],
              on_exit: Callable[[], None]) -> WorkerWake | None:
        """Listen on the channel's doorbell; None (the caller keeps polling often) when another
        live daemon already owns this data dir's doorbell."""
        try:
            bell = Doorbell(directory)
        except OSError as exc:
            log.warning("no worker doorbell (%s): another daemon on %s? polling the worker instead",
                        exc, directory)
            return None
        return cls(loop, bell, on_ring, on_exit)

    def watch_exit(self, pid: int) -> None:
        """Wake when process pid exits (a crash is noticed at once, not at the next poll)."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            self._on_exit()  # already gone: let the chores find out now
            return
        self._exit_fds.add(fd)
        self._loop.add_reader(fd, self._exited, fd)

    def close(self) -> None:
        """Stop watching; safe to call twice."""
        for fd in list(self._exit_fds):
            self._forget(fd)
        if self._bell is not None:
            self._loop.remove_reader(self._bell.fileno())
            self._bell.close()
            self._bell = None

    def _rang(self) -> None:
        if self._bell is not None and self._bell.drain():
            self._on_ring()

    def _exited(self, fd: int) -> None:
        self._forget(fd)
        self._on_exit()

    def _forget(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        self._exit_fds.discard(fd)
        os.close(fd)
