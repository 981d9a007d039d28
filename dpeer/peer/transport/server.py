"""Serves the dpeer.v1.Peer service: validates the caller, hands requests to a PeerHandler."""

from __future__ import annotations

import hmac
import logging
from typing import AsyncIterator, Awaitable, Callable, Protocol

import grpc

from dpeer.peer import errors
from dpeer.peer.transport.options import MAX_MESSAGE_BYTES, TOKEN_HEADER, Security
from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.proto.v1 import dpeer_pb2_grpc as pbg

log = logging.getLogger("dpeer.transport")

_CODES = {
    errors.BadRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Behind: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Denied: grpc.StatusCode.PERMISSION_DENIED,
}


class PeerHandler(Protocol):
    """What the daemon implements; raise errors.PeerError subclasses to refuse a call."""

    async def deliver(self, envelope: pb.Envelope) -> None:
        """Take one protocol message (probe, ack, Raft) from a peer."""

    def fetch_entries(self, request: pb.FetchEntriesRequest) -> AsyncIterator[pb.EntryChunk]:
        """Stream committed entries from request.from_index on."""

    def fetch_snapshot(self, request: pb.FetchSnapshotRequest) -> AsyncIterator[pb.SnapshotChunk]:
        """Stream the newest snapshot from request.offset on."""

    async def join(self, request: pb.JoinRequest) -> pb.JoinReply:
        """Admit a node to the cluster (through the leader)."""

    async def leave(self, request: pb.LeaveRequest) -> pb.LeaveReply:
        """Remove a node (this one when node_id is empty) gracefully."""

    async def status(self) -> pb.StatusReply:
        """This node's status document."""

    async def kv_put(self, request: pb.KvPutRequest) -> pb.KvPutReply:
        """Commit a setting; answer once it is committed."""

    async def kv_get(self, request: pb.KvGetRequest) -> pb.KvGetReply:
        """A linearizable read of a setting."""


class TokenCheck(grpc.aio.ServerInterceptor):
    """Refuses, and logs, every call that lacks the cluster token."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """Pass calls with the right token on; answer the rest with UNAUTHENTICATED."""
        sent = dict(details.invocation_metadata or ()).get(TOKEN_HEADER, "")
        if hmac.compare_digest(str(sent).encode(), self._token):
            return await continuation(details)
        log.warning("refused a call to %s: missing or wrong cluster token", details.method)
        return _deny


async def _deny_call(request: object, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "this cluster requires its cluster token")


_deny = grpc.unary_unary_rpc_method_handler(_deny_call)


async def _unary(context: grpc.aio.ServicerContext, call: Awaitable[object]) -> object:
    try:
        return await call
    except errors.PeerError as exc:
        await context.abort(_CODES.get(type(exc), grpc.StatusCode.UNKNOWN), str(exc))


async def _stream(context: grpc.aio.ServicerContext, items: AsyncIterator[object]) -> AsyncIterator[object]:
    try:
        async for item in items:
            yield item
    except errors.PeerError as exc:
        await context.abort(_CODES.get(type(exc), grpc.StatusCode.UNKNOWN), str(exc))


class _Servicer(pbg.PeerServicer):
    """Adapts gRPC calls to the handler, turning PeerErrors into status codes."""

    def __init__(self, handler: PeerHandler) -> None:
        self._h = handler

    async def Deliver(self, request: pb.Envelope, context: grpc.aio.ServicerContext) -> pb.Delivered:
        await _unary(context, self._h.deliver(request))
        return pb.Delivered()

    def FetchEntries(self, request: pb.FetchEntriesRequest, context: grpc.aio.ServicerContext) -> AsyncIterator:
        return _stream(context, self._h.fetch_entries(request))

    def FetchSnapshot(self, request: pb.FetchSnapshotRequest, context: grpc.aio.ServicerContext) -> AsyncIterator:
        return _stream(context, self._h.fetch_snapshot(request))

    async def Join(self, request: pb.JoinRequest, context: grpc.aio.ServicerContext) -> pb.JoinReply:
        return await _unary(context, self._h.join(request))

    async def Leave(self, request: pb.LeaveRequest, context: grpc.aio.ServicerContext) -> pb.LeaveReply:
        return await _unary(context, self._h.leave(request))

    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusReply:
        return await _unary(context, self._h.status())

    async def KvPut(self, request: pb.KvPutRequest, context: grpc.aio.ServicerContext) -> pb.KvPutReply:
        return await _unary(context, self._h.kv_put(request))

    async def KvGet(self, request: pb.KvGetRequest, context: grpc.aio.ServicerContext) -> pb.KvGetReply:
        return await _unary(context, self._h.kv_get(request))


async def serve(listen: str, handler: PeerHandler, security: Security) -> grpc.aio.Server:
    """Bind exactly `listen` and start serving; OSError when the address cannot be bound."""
    interceptors = [TokenCheck(security.token)] if security.token else []
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    pbg.add_PeerServicer_to_server(_Servicer(handler), server)
    try:
        if security.tls:
            creds = grpc.ssl_server_credentials(
                [(security.key, security.cert)], root_certificates=security.ca, require_client_auth=True
            )
            port = server.add_secure_port(listen, creds)
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {listen}: the address is in use or not on this machine")
    await server.start()
    return server
