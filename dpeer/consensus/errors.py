"""The errors a Storage raises under the Raft log's rules (storage.py), whoever implements it.

The state machine's LMDB store raises these same classes (statemachine/errors.py names the base
StoreError), so the core catches Compacted from any storage without knowing which it has.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class for every error raised by a Raft storage."""


class Compacted(StorageError):
    """The requested log range starts below the first index still held; serve a snapshot instead."""


class CommittedEntryError(StorageError):
    """An operation would change or remove a committed entry, which Raft never allows."""


class LogGapError(StorageError, ValueError):
    """Appended entries would leave a hole in the log or are not contiguous."""


class StaleSnapshot(StorageError, ValueError):
    """A snapshot at or below the commit index was offered; installing it would move state back."""


class HardStateError(StorageError, ValueError):
    """A term/vote update would lower the term or change a vote already given in this term."""
