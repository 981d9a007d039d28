"""Snapshot bytes: a sealed, self-describing copy of the applied state at one log position.

Pure: the format is msgpack ``[version, index, term, state]`` behind a CRC32 prefix, so a peer can
validate a snapshot completely before installing it.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from dpeer.statemachine.errors import CorruptState
from dpeer.statemachine.state import ClusterState, seal, state_from_dict, state_to_dict, unseal

SNAPSHOT_VERSION = 1


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """The applied state as of log position (index, term), encoded as sealed bytes."""

    index: int
    term: int
    data: bytes


def encode_snapshot(state: ClusterState) -> StateSnapshot:
    """Encode a state as a snapshot at its own applied index and term."""
    body = [SNAPSHOT_VERSION, state.applied_index, state.applied_term, state_to_dict(state)]
    data = seal(msgpack.packb(body, use_bin_type=True))
    return StateSnapshot(state.applied_index, state.applied_term, data)


def decode_snapshot(index: int, term: int, data: bytes) -> ClusterState:
    """Validate snapshot bytes claimed to be at (index, term); raises CorruptState on any defect."""
    try:
        body = msgpack.unpackb(unseal(data), raw=False, strict_map_key=True)
    except CorruptState:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise CorruptState(f"snapshot is not valid msgpack: {exc}") from exc
    if type(body) is not list or len(body) != 4 or body[0] != SNAPSHOT_VERSION:
        raise CorruptState("snapshot is not [version, index, term, state] of a known version")
    if body[1] != index or body[2] != term:
        raise CorruptState(f"snapshot holds ({body[1]}, {body[2]}), expected ({index}, {term})")
    state = state_from_dict(body[3])
    if (state.applied_index, state.applied_term) != (index, term):
        raise CorruptState("snapshot state's applied index/term disagree with its header")
    return state
