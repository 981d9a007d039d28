"""A box that comes back after its job finished takes the final state from a peer.

The job ends with a final checkpoint that a majority of the last group holds (its entry in the
log names the holders and the parameters' digest). A daemon whose box lacks that file fetches it
from the holders, one after the other, verifies it (the file's own sha256 and the committed
parameter digest in its header), writes it atomically into its checkpoints folder, and has its
worker load it instead of training alone to the end.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from dpeer.channel.checkpoint_files import (
    StateError, checkpoint_path, read_checkpoint, read_state_header, unwrap_checkpoint, write_checkpoint,
)
from dpeer.daemon.node.driver import Node
from dpeer.daemon.worker.supervisor import Worker
from dpeer.errors import PeerError
from dpeer.statemachine.state import JobState
from dpeer.transport.api import PeerClient, Transport

log = logging.getLogger("dpeer.final_state")
FETCH_TIMEOUT = 300.0
FETCH_RETRY = 5.0


class FinalState:
    """The worker link's chore: once the job is committed finished, a box without the final
    checkpoint fetches it from a holder (again every FETCH_RETRY seconds while none serves it),
    then restarts its worker to load it."""

    def __init__(self, node: Node, transport: Transport, worker: Worker, ckpt_dir: Path) -> None:
        self.node, self.transport, self.worker, self.ckpt_dir = node, transport, worker, ckpt_dir
        self.task: asyncio.Task | None = None
        self._next_fetch = 0.0

    def __call__(self, now: float) -> None:
        """Start a fetch when the job finished, this box lacks its state and none is under way."""
        state = self.node.reads.state
        job, ckpt = state.job, state.checkpoint
        if job.state is not JobState.FINISHED or ckpt is None or self.worker.done or now < self._next_fetch:
            return
        if self.task is not None and not self.task.done():
            return
        if holds(self.ckpt_dir, job.step, job.digest):
            return
        self._next_fetch = now + FETCH_RETRY
        sources = [(n, state.members[n].addr) for n in ckpt.holders if n != self.node.id and n in state.members]
        self.task = asyncio.get_running_loop().create_task(self._fetch(job.step, job.digest, sources))

    async def _fetch(self, step: int, digest: str, sources: list[tuple[str, str]]) -> None:
        log.info("the job finished at step %d while this box was away: fetching that state from %s",
                 step, ", ".join(n for n, _ in sources) or "nobody (no other holder)")
        source = await fetch_final(step, digest, sources, self.ckpt_dir, self.transport)
        if source is not None:
            self.worker.restart(self.node.clock(), f"load the final state of step {step} fetched from {source}")


def holds(ckpt_dir: Path, step: int, digest: str) -> bool:
    """Whether this box holds a verified checkpoint of `step` with parameter digest `digest`."""
    try:
        return _params_digest(read_checkpoint(checkpoint_path(str(ckpt_dir), step))) == digest
    except (OSError, StateError):
        return False


def _params_digest(data: bytes) -> str:
    return str(read_state_header(data).get("params_digest", ""))


async def fetch_final(
    step: int, digest: str, sources: list[tuple[str, str]], ckpt_dir: Path, transport: Transport,
) -> str | None:
    """Fetch the checkpoint of `step` from the first of `sources` ((node id, addr)) that serves a
    file holding `digest`; returns the node it came from, or None when none did (each failure logged)."""
    for node_id, addr in sources:
        try:
            data = unwrap_checkpoint(await _download(transport.client(addr, timeout=FETCH_TIMEOUT), step),
                                     f"{node_id}'s checkpoint of step {step}")
            got = _params_digest(data)
        except (PeerError, StateError) as exc:
            log.warning("could not fetch the final checkpoint of step %d from %s: %s", step, node_id, exc)
            continue
        if got != digest:
            log.warning("%s's checkpoint of step %d holds digest %s, not the committed %s; trying the next holder",
                        node_id, step, got[:12], digest[:12])
            continue
        write_checkpoint(str(ckpt_dir), step, data)
        log.info("fetched the final checkpoint of step %d (%d bytes) from %s", step, len(data), node_id)
        return node_id
    return None


async def _download(client: PeerClient, step: int) -> bytes:
    parts: list[bytes] = []
    received = 0
    async for chunk in client.fetch_checkpoint(step):
        if chunk.offset != received:
            raise StateError(f"chunk at offset {chunk.offset} does not follow the {received} bytes received")
        parts.append(chunk.data)
        received += len(chunk.data)
        if chunk.done:
            return b"".join(parts)
    raise StateError("the stream ended before the last chunk")
