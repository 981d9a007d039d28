"""A step's parameter digest, hashed on a thread while the next step computes.

The digest every ``digest_every`` steps (sha256 of every parameter and buffer: 24 ms for 19 MB
here) held the step up for the whole hash. Forward and backward only read the parameters and only
the optimizer's step writes them, so the hash can run beside the next step's forward and backward
(hashlib releases the GIL on large buffers) and the loop waits for it just before that optimizer
step, and before anything else that writes them (a heal, a resume). Buffers are another matter:
a forward writes BatchNorm's running statistics, so they are hashed from copies taken at the start
(state.digest_later).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable


class BackgroundDigest:
    """At most one digest in flight: ``start`` it after a step, ``settle`` it before the parameters change."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpeer-digest")
        self._pending: tuple[int, Future[str]] | None = None

    def start(self, step: int, digest: Callable[[], str]) -> None:
        """Run ``digest`` (state.digest_later: the state after ``step`` steps) on the thread."""
        if self._pending is not None:
            raise RuntimeError("a digest is already in flight; settle it first")
        self._pending = (step, self._pool.submit(digest))

    def settle(self) -> tuple[int, str] | None:
        """Wait for the digest in flight: (its step, its hex digest), or None when none was."""
        if self._pending is None:
            return None
        (step, future), self._pending = self._pending, None
        return step, future.result()

    def close(self) -> None:
        """Stop the thread (a digest in flight is waited for and dropped)."""
        self._pending = None
        self._pool.shutdown(wait=True)
