"""systemd's notify protocol (READY=1, WATCHDOG=1, STOPPING=1) over $NOTIFY_SOCKET.

A datagram to a Unix socket; a dozen lines do not warrant a dependency. Without
NOTIFY_SOCKET (not under systemd) every call does nothing.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends state lines to systemd when it is watching."""

    def __init__(self, path: str | None = None) -> None:
        self._path = path if path is not None else os.environ.get("NOTIFY_SOCKET")
        if self._path and self._path.startswith("@"):
            self._path = "\0" + self._path[1:]

    @property
    def enabled(self) -> bool:
        """True under systemd (or a test's fake socket)."""
        return bool(self._path)

    def send(self, *lines: str) -> bool:
        """Send KEY=VALUE lines in one datagram; False when nobody listens."""
        if not self._path:
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto("\n".join(lines).encode(), self._path)
            except OSError:
                return False
        return True

    def ready(self, status: str) -> bool:
        """READY=1 with a human STATUS line."""
        return self.send("READY=1", f"STATUS={status}")

    def watchdog(self) -> bool:
        """WATCHDOG=1: the event loop is alive."""
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        """STOPPING=1 on graceful shutdown."""
        return self.send("STOPPING=1")


def watchdog_interval() -> float | None:
    """Half of systemd's WatchdogSec (from $WATCHDOG_USEC), or None when no watchdog is set."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    return int(usec) / 2_000_000
