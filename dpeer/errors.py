"""Errors the daemon's handlers raise; the transport maps each to a gRPC status (pure, no grpc here)."""

from __future__ import annotations


class PeerError(Exception):
    """Base of the errors a handler returns to a remote caller as one clear sentence."""


class BadRequest(PeerError):
    """A message failed validation: the caller sent something absurd or malformed."""


class NotFound(PeerError):
    """The thing asked for does not exist (an absent key)."""


class Unavailable(PeerError):
    """The node cannot answer now (no leader, no quorum, shutting down); try again or elsewhere."""


class Behind(PeerError):
    """The requested entries are compacted away here; fetch a snapshot instead."""


class Denied(PeerError):
    """The caller is not a member of this cluster or lacks its token."""


class Unreachable(PeerError):
    """A remote node did not answer; `refused` is True when its port actively refused (process gone)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class WrongProtocol(Unreachable):
    """Something answered at the address, but not as a dpeer node (another gRPC service, an HTTP
    server, another protocol): for dpeer the node is unreachable there."""
