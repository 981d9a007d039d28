"""What a process holds, read from Linux's /proc: its sockets by inode. Shared by the daemon (whose
bytes cross sites, serve/tcp_diag) and the worker (which of its connections a Gloo group made,
trainer/gloo_cut). Elsewhere than Linux, and for a process that is gone or not ours, it finds nothing."""

from __future__ import annotations

import os


def sockets(pid: int | None = None) -> dict[int, int]:
    """The sockets process ``pid`` holds (None: this process), socket inode -> file descriptor."""
    base = "/proc/self/fd" if pid is None else f"/proc/{pid}/fd"
    held: dict[int, int] = {}
    try:
        fds = os.listdir(base)
    except OSError:
        return held
    for fd in fds:
        try:
            link = os.readlink(f"{base}/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            held[int(link[8:-1])] = int(fd)
    return held
