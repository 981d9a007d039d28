"""ReadIndex: the leader's linearizable reads, from request to the ReadState the caller gets.

A read waits for two things: the leader's commit of an entry of its own term (the index it
reads at is then the commit index known when it was asked, or that first commit), and a quorum
of voters acknowledging a heartbeat that carried the read's sequence number or a later one.
"""

from __future__ import annotations

from typing import Any

from dpeer.consensus.progress import Tracker
from dpeer.consensus.ready import ReadState


class ReadIndex:
    """Reads asked of this leader: `seq` (the last request id), `pending` ([request_id, index or
    None] in request order) and `states` (confirmed reads for the next Ready)."""

    def __init__(self) -> None:
        self.seq = 0
        self.pending: list[list[Any]] = []
        self.states: list[ReadState] = []

    def request(self, index: int | None) -> int:
        """A new read at index (None until the leader commits in its term); its request id."""
        self.seq += 1
        self.pending.append([self.seq, index])
        return self.seq

    def term_committed(self, committed: int) -> None:
        """The leader's first commit of its term: reads waiting for it read at that index."""
        for read in self.pending:
            read[1] = committed if read[1] is None else read[1]

    def drop(self) -> None:
        """Leadership is lost: the pending reads are dropped (the caller times out and retries)."""
        self.pending = []

    def confirm(self, tracker: Tracker, self_id: str) -> None:
        """Move the reads a quorum acknowledged, in order, to `states`."""
        while self.pending:
            rid, index = self.pending[0]
            if index is None or not tracker.read_confirmed(self_id, rid):
                return
            self.pending.pop(0)
            self.states.append(ReadState(rid, index))

    def take(self) -> list[ReadState]:
        """Hand the confirmed reads over (to a Ready) and start afresh."""
        states, self.states = self.states, []
        return states
