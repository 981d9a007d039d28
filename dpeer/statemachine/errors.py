"""Exceptions raised by the durable state machine; kept free of lmdb so any layer can catch them.

The Raft log's rules are consensus's (consensus/errors.py): the store raises those same classes,
and its own errors below share their base, StoreError (consensus's StorageError).
"""

from __future__ import annotations

from dpeer.consensus.errors import (
    CommittedEntryError,
    Compacted,
    HardStateError,
    LogGapError,
    StaleSnapshot,
    StorageError,
)

__all__ = [
    "CommittedEntryError", "Compacted", "CorruptEntry", "CorruptState", "HardStateError", "LogGapError",
    "NodeIdMismatch", "StaleSnapshot", "StoreClosed", "StoreError", "StoreForkedError", "StoreFormatError",
    "StoreWriteFailed",
]

StoreError = StorageError
"""Base class for every error raised by the state machine package (and by any Raft storage)."""


class CorruptEntry(StoreError, ValueError):
    """An encoded log entry failed its CRC or shape checks; the bytes cannot be trusted."""


class CorruptState(StoreError, ValueError):
    """A serialized cluster state or snapshot failed its CRC or validation checks."""


class StoreFormatError(StoreError):
    """The store was written by a newer dpeer format version; it is left untouched."""


class NodeIdMismatch(StoreError):
    """The store on disk belongs to another node id; opening it would steal its identity."""


class StoreForkedError(StoreError):
    """The store was opened in another process (before a fork); LMDB handles must not cross fork."""


class StoreClosed(StoreError):
    """The store was used after close()."""


class StoreWriteFailed(StoreError):
    """A write transaction failed (the disk full, an I/O error): it was rolled back, so what was
    committed before stays on disk, but this process's memory may now be ahead of its disk. The
    store refuses every later write, and its owner must stop (a node that went on could send a
    vote or an acknowledgement its disk never kept)."""
