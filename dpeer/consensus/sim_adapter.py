"""RaftActor: a RaftNode plus MemoryStorage driven by dpeer.sim's Simulator.

It plays the daemon's part in one process: each Ready is persisted to the MemoryStorage
(consensus.ready.persist, the daemon's path too) before its messages are returned to the simulator,
so after sim.crash() the storage holds exactly what a real node would have fsynced, and
restart() builds a new RaftActor over the same storage object. Messages travel as Stamped:
the sender's identity and the store uid they are meant for, as the daemon's envelopes carry.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Protocol

from dpeer.consensus.config import RaftConfig
from dpeer.consensus.core import RaftNode
from dpeer.consensus.entry import Entry, RaftKind
from dpeer.consensus.voting import VotingConfig
from dpeer.consensus.messages import InvalidRaftMessage, Message, Peer
from dpeer.consensus.ready import Outgoing, Ready, drive, persist
from dpeer.consensus.storage import MemoryStorage

Outbox = list[tuple[str, Any]]
# The modelled application's own entry kinds (the state machine's names for the same records)
VIEW, KV_PUT = "view", "kv_put"


@dataclass(frozen=True)
class Stamped:
    """A Raft message on the simulated wire: who sent it and the store uid it is meant for."""

    sender: Peer
    to_uid: str
    msg: Message


class Observer(Protocol):
    """Receives every persisted Ready and every applied entry (invariant checkers, metrics)."""

    def on_ready(self, node_id: str, node: RaftNode, rd: Ready) -> None:
        """Called after rd was persisted and applied, before its messages leave."""

    def on_apply(self, node_id: str, entry: Entry, effective_view: bool) -> None:
        """Called for each applied entry; effective_view marks a view that took effect."""


class RaftActor:
    """The simulator Actor for one Raft node; `state` is a tiny applied state machine."""

    def __init__(self, node_id: str, storage: MemoryStorage, config: RaftConfig,
                 rng: random.Random, now: float, observer: Observer | None = None,
                 compact_every: int = 0) -> None:
        self.id, self.storage, self.observer = node_id, storage, observer
        self.compact_every = compact_every
        self.node = RaftNode(node_id, storage, config, rng, now)
        snap = storage.snapshot()
        self.state: dict[str, Any] = _decode_state(snap.data)
        self.applied_membership = snap.membership
        self.invalid = 0
        self._replay_applied()

    # -- Actor ------------------------------------------------------------------------------
    def receive(self, now: float, src: str, msg: Stamped) -> Outbox:
        """Step one message, then persist and return what the node sends."""
        try:
            self.node.step(now, msg.sender, msg.msg, msg.to_uid)
        except InvalidRaftMessage:
            self.invalid += 1
        return self.drain()

    def tick(self, now: float) -> Outbox:
        """Run the node's timers."""
        self.node.tick(now)
        return self.drain()

    def next_tick(self) -> float | None:
        """The node's next timer deadline."""
        return self.node.next_deadline()

    # -- Ready loop -------------------------------------------------------------------------
    def drain(self) -> Outbox:
        """Handle every pending Ready (consensus.ready.drive): persist, apply, then release the
        messages into the outbox returned."""
        self._out: Outbox = []
        drive(self.node, self)
        out, self._out = self._out, []
        return out

    def apply(self, entries: tuple[Entry, ...]) -> None:
        """ReadyHandler: apply committed entries to the modelled state, then compact."""
        for entry in entries:
            self.storage.apply_to(entry.index)
            self._apply(entry)
        self._maybe_compact()

    def send(self, messages: tuple[Outgoing, ...]) -> None:
        """ReadyHandler: stamp and queue the messages."""
        me = self.node.identity
        self._out.extend((dst, Stamped(me, uid, msg)) for dst, uid, msg in messages)

    def observe(self, rd: Ready) -> None:
        """ReadyHandler: tell the observer (the safety checks)."""
        if self.observer is not None:
            self.observer.on_ready(self.id, self.node, rd)

    def persist(self, rd: Ready) -> None:
        """ReadyHandler: the snapshot, then hard state, entries and commit index (consensus.ready.persist)."""
        persist(self.storage, rd)
        if rd.snapshot is not None:
            self.state = _decode_state(rd.snapshot.data)
            self.applied_membership = rd.snapshot.membership

    def _apply(self, entry: Entry) -> None:
        effective = False
        if entry.kind == RaftKind.CONFIG_CHANGE:
            self.applied_membership = VotingConfig.from_payload(entry.payload)
        elif entry.kind == VIEW and entry.payload["generation"] > self.state["view"]:
            self.state["view"] = entry.payload["generation"]
            effective = True
        elif entry.kind == KV_PUT:
            self.state["kv"][entry.payload["key"]] = entry.payload["value"]
        if self.observer is not None:
            self.observer.on_apply(self.id, entry, effective)

    def _replay_applied(self) -> None:
        """Rebuild the in-memory state from the snapshot plus the applied stored entries."""
        lo = self.storage.snapshot_index + 1
        for entry in self.storage.entries(lo, self.storage.last_applied + 1) if lo <= \
                self.storage.last_applied else []:
            observer, self.observer = self.observer, None
            self._apply(entry)
            self.observer = observer

    def _maybe_compact(self) -> None:
        applied = self.storage.last_applied
        if self.compact_every and applied - self.storage.snapshot_index >= self.compact_every:
            self.storage.compact(applied, _encode_state(self.state), self.applied_membership,
                                 keep_tail=self.compact_every // 2)


def _encode_state(state: dict[str, Any]) -> bytes:
    return json.dumps(state, sort_keys=True).encode()


def _decode_state(data: bytes) -> dict[str, Any]:
    return json.loads(data) if data else {"view": 0, "kv": {}}
