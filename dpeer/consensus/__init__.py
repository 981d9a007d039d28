"""A pure Raft consensus core in the manner of etcd-io/raft: no I/O, no clock, no threads.

The caller owns disk, network and time: it feeds messages and `now` in, then drains a `Ready`
(persist hard state and entries, install a snapshot, apply committed entries, send messages)
and confirms with `advance`. See core.RaftNode for the contract.
"""

from dpeer.consensus.config import EDGE, LAN, WAN, RaftConfig
from dpeer.consensus.core import RaftNode
from dpeer.consensus.force import force_after
from dpeer.consensus.messages import Peer
from dpeer.consensus.ready import (
    AcceptResult,
    HardState,
    NotLeader,
    Outgoing,
    Proposed,
    ReadRequested,
    ReadState,
    Ready,
    Refused,
    Role,
    SoftState,
)
from dpeer.consensus.storage import MemoryStorage, Snapshot, Storage, StorageWriter, bootstrap
from dpeer.consensus.voting import ConfigChangeError, VotingConfig

__all__ = [
    "AcceptResult", "ConfigChangeError", "EDGE", "HardState", "LAN", "MemoryStorage", "NotLeader", "Outgoing",
    "Peer", "Proposed", "RaftConfig", "RaftNode", "ReadRequested", "ReadState", "Ready", "Refused", "Role",
    "Snapshot", "SoftState", "Storage", "StorageWriter", "VotingConfig", "WAN", "bootstrap", "force_after",
]
