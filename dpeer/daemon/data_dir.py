"""The data dir's privacy: whoever starts the daemon, only its user reads what it and its workers
write (the store holds each generation's rendezvous secret; checkpoints hold the model)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077  # what the daemon and its workers create only their user may read: dirs 0700, files 0600

log = logging.getLogger("dpeer.daemon")


def private_data_dir(data_dir: Path) -> None:
    """Make what this daemon and its workers write readable by their user only: the umask 0o077
    for this process (the workers inherit it), and the data dir made 0700, or, when it exists
    open to group or others, changed to 0700 with a log line (nothing in it is touched).
    OSError in one sentence when it cannot be changed (another user owns it)."""
    os.umask(PRIVATE_UMASK)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if not mode & 0o077:
        return
    try:
        data_dir.chmod(mode & 0o700)
    except OSError as exc:
        raise OSError(f"the data dir {data_dir} is mode {mode:04o}, open to other users, and cannot be made "
                      f"{mode & 0o700:04o} ({exc.strerror}); run `chmod 700 {data_dir}` as its owner") from None
    log.warning("the data dir %s was mode %04o, open to other users (its store holds the cluster's secrets); "
                "made it %04o", data_dir, mode, mode & 0o700)
