"""The chaos tool's fault policy for real daemons: ``<data_dir>/faults.json``, read when it changes.

Only the chaos daemon entry (``python -m dpeer.chaos.daemon``, dpeer/chaos/daemon.py) reads it:
it wraps the daemon's transport in a FaultyTransport (dpeer/transport/faulty.py) whose verdict is
``FaultHook.verdict``; ``dpeer start`` has no fault hook. While the file does not exist every
message goes out untouched; the only cost is one ``stat`` per ``RECHECK`` seconds. The chaos run
(dpeer/chaos/run.py) writes the file to cut, thin or slow a node's traffic:

    {"drop": ["127.0.0.1:7103"],   # peer addresses whose outgoing messages are dropped (partition)
     "loss": 0.2,                  # probability of dropping any other outgoing message (packet loss)
     "delay": 0.1}                 # seconds added before each outgoing message leaves (slow node)

Every key is optional; ``{}`` or a missing file means no fault. The file is re-read when its
mtime (or inode or size) changes, so writing it atomically (temp file + rename) takes effect
within ``RECHECK`` seconds. A file that does not parse is ignored (logged once) and the previous
faults stay in force.

Scope: only the transport's ``send`` consults the hook, i.e. the one-way ``Deliver`` messages of the
control plane (SWIM gossip, Raft). A partition is made symmetric by writing the file on both
sides. Request/response calls (join, kv forwarding, group-failed reports, resync fetches) and the
workers' Gloo traffic are NOT cut: a partitioned node keeps its workers' collectives with the
majority until the daemon fences its worker (no leader for ``fence_after``, about 2 s on the lan
preset), after which the majority re-forms without it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

log = logging.getLogger("dpeer.faults")
RECHECK = 0.1
FILENAME = "faults.json"


@dataclass(frozen=True)
class Faults:
    """The faults in force: addresses to drop, a loss probability, an added delay in seconds."""

    drop: frozenset[str] = field(default_factory=frozenset)
    loss: float = 0.0
    delay: float = 0.0

    @classmethod
    def parse(cls, data: object) -> Faults:
        """Validate the decoded JSON; ValueError when it is not the documented shape."""
        if not isinstance(data, dict):
            raise ValueError("faults file must hold a JSON object")
        unknown = set(data) - {"drop", "loss", "delay"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}")
        drop = data.get("drop", [])
        if not isinstance(drop, list) or not all(isinstance(a, str) for a in drop):
            raise ValueError("drop must be a list of HOST:PORT strings")
        loss, delay = float(data.get("loss", 0.0)), float(data.get("delay", 0.0))
        if not 0.0 <= loss <= 1.0 or not 0.0 <= delay <= 60.0:
            raise ValueError("loss must be in [0, 1] and delay in [0, 60] seconds")
        return cls(frozenset(drop), loss, delay)

    @property
    def active(self) -> bool:
        """True when any fault is in force."""
        return bool(self.drop) or self.loss > 0 or self.delay > 0


class FaultHook:
    """Reads ``path`` when it changes and decides the fate of each outgoing message."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.path = Path(path)
        self._clock = clock
        self._rng = rng or random.Random()
        self._sig: tuple[int, int, int] | None = None
        self._next_check = 0.0
        self.faults = Faults()
        self.dropped = 0
        self.delayed = 0

    @classmethod
    def for_data_dir(cls, data_dir: Path) -> FaultHook:
        """The hook of a daemon whose data dir is data_dir."""
        return cls(Path(data_dir) / FILENAME)

    def _refresh(self) -> None:
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + RECHECK
        try:
            st = os.stat(self.path)
        except OSError:
            if self._sig is not None:
                log.warning("fault injection file %s removed: no faults", self.path)
            self._sig, self.faults = None, Faults()
            return
        sig = (st.st_mtime_ns, st.st_ino, st.st_size)
        if sig == self._sig:
            return
        self._sig = sig
        try:
            faults = Faults.parse(json.loads(self.path.read_text() or "{}"))
        except (OSError, ValueError) as exc:
            log.warning("ignoring fault injection file %s: %s", self.path, exc)
            return
        if faults != self.faults:
            log.warning("TEST fault injection from %s: drop %s, loss %.2f, delay %.3fs", self.path,
                        sorted(faults.drop), faults.loss, faults.delay)
        self.faults = faults

    def verdict(self, addr: str) -> float | None:
        """None: drop the message to addr; otherwise the seconds to hold it before sending (0: none)."""
        self._refresh()
        f = self.faults
        if not f.active:
            return 0.0
        if addr in f.drop or (f.loss > 0 and self._rng.random() < f.loss):
            self.dropped += 1
            return None
        if f.delay > 0:
            self.delayed += 1
        return f.delay


def write_faults(data_dir: Path, drop: list[str] | None = None, loss: float = 0.0, delay: float = 0.0) -> None:
    """Atomically write data_dir/faults.json (what the chaos tool calls); all defaults clear it."""
    path = Path(data_dir) / FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(FILENAME + ".tmp")
    tmp.write_text(json.dumps({"drop": sorted(drop or []), "loss": loss, "delay": delay}))
    os.replace(tmp, path)
