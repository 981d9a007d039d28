"""Exceptions raised by the durable state machine; kept free of lmdb so any layer can catch them."""

from __future__ import annotations


class StoreError(Exception):
    """Base class for every error raised by the state machine package."""


class CorruptEntry(StoreError, ValueError):
    """An encoded log entry failed its CRC or shape checks; the bytes cannot be trusted."""


class CorruptState(StoreError, ValueError):
    """A serialized cluster state or snapshot failed its CRC or validation checks."""


class StoreFormatError(StoreError):
    """The store was written by a newer dpeer format version; it is left untouched."""


class NodeIdMismatch(StoreError):
    """The store on disk belongs to another node id; opening it would steal its identity."""


class Compacted(StoreError):
    """The requested log range starts below the first index still held; serve a snapshot instead."""


class CommittedEntryError(StoreError):
    """An operation would change or remove a committed entry, which Raft never allows."""


class LogGapError(StoreError, ValueError):
    """Appended entries would leave a hole in the log or are not contiguous."""


class StaleSnapshot(StoreError, ValueError):
    """A snapshot at or below the commit index was offered; installing it would move state back."""


class HardStateError(StoreError, ValueError):
    """A term/vote update would lower the term or change a vote already given in this term."""


class StoreForkedError(StoreError):
    """The store was opened in another process (before a fork); LMDB handles must not cross fork."""


class StoreClosed(StoreError):
    """The store was used after close()."""
