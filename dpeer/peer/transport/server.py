"""Serves the dpeer.v1.Peer service: validates the caller, hands requests to a PeerHandler."""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import AsyncIterator, Awaitable, Callable, Protocol

import grpc

from dpeer.peer import errors
from dpeer.peer.transport.options import (
    HTTP2_OPTIONS,
    MAX_BATCH_MESSAGES,
    MAX_MESSAGE_BYTES,
    TOKEN_HEADER,
    Security,
)
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

    def note_malformed(self, method: str) -> None:
        """Count a request whose bytes did not decode (the transport already refused it)."""

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

    async def group_failed(self, request: pb.GroupFailedRequest) -> pb.GroupFailedReply:
        """A worker's group failed: re-form it under a new generation."""

    async def force(self, request: pb.ForceRequest) -> pb.ForceReply:
        """Operator's forced reconfiguration to the given voters (unsafe, logged)."""

    async def report_checkpoint(self, request: pb.CheckpointReport) -> pb.CheckpointReply:
        """A node holds a checkpoint (through the leader, which records it once a majority does)."""

    async def status(self) -> pb.StatusReply:
        """This node's status document."""

    async def kv_put(self, request: pb.KvPutRequest) -> pb.KvPutReply:
        """Commit a setting; answer once it is committed."""

    async def kv_get(self, request: pb.KvGetRequest) -> pb.KvGetReply:
        """A linearizable read of a setting."""

    async def job_control(self, request: pb.JobControlRequest) -> pb.JobControlReply:
        """An operator's job command (retry a failed job), committed through the leader."""

    def fetch_checkpoint(self, request: pb.FetchCheckpointRequest) -> AsyncIterator[pb.CheckpointChunk]:
        """Stream a checkpoint file this node holds, from request.offset on."""


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
        return _deny_stream if details.method == STREAM_METHOD else _deny


async def _deny_call(request: object, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "this cluster requires its cluster token")


STREAM_METHOD = "/dpeer.v1.Peer/Stream"
_deny = grpc.unary_unary_rpc_method_handler(_deny_call)
_deny_stream = grpc.stream_unary_rpc_method_handler(_deny_call)


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


class Malformed:
    """Stands in for a request whose bytes are not a valid protobuf of the method's type."""

    def __init__(self, method: str, size: int, reason: str) -> None:
        self.method, self.size, self.reason = method, size, reason


def _safe(method: str, parse: Callable[[bytes], object]) -> Callable[[bytes], object]:
    """A request deserializer that never raises: undecodable bytes become a Malformed."""

    def deserialize(data: bytes) -> object:
        try:
            return parse(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError and friends, whatever protobuf raises
            return Malformed(method, len(data), str(exc)[:200])

    return deserialize


class _Servicer(pbg.PeerServicer):
    """Adapts gRPC calls to the handler, turning PeerErrors into status codes.

    Undecodable request bytes are answered INVALID_ARGUMENT (not gRPC's UNKNOWN with a
    Python exception text), logged, and counted through the handler's `note_malformed`.
    """

    def __init__(self, handler: PeerHandler) -> None:
        self._h = handler
        self.streams: set[asyncio.Task] = set()

    def _malformed(self, request: Malformed) -> str:
        log.warning("refused an undecodable %s request (%d bytes): %s", request.method, request.size, request.reason)
        self._h.note_malformed(request.method)
        return f"the {request.method} request is not a valid protobuf message"

    async def _refuse(self, context: grpc.aio.ServicerContext, request: Malformed) -> None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self._malformed(request))

    async def Deliver(self, request: pb.Envelope, context: grpc.aio.ServicerContext) -> pb.Delivered:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        await _unary(context, self._h.deliver(request))
        return pb.Delivered()

    async def Stream(self, requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> pb.Delivered:
        """Each batch's envelopes are delivered in order, each as Deliver would; one that the handler
        refuses is counted and logged there and the stream goes on. An undecodable or oversized
        batch ends the stream with INVALID_ARGUMENT."""
        task = asyncio.current_task()
        if task is not None:
            self.streams.add(task)
        try:
            await context.send_initial_metadata(())
            async for batch in requests:
                if isinstance(batch, Malformed):
                    await self._refuse(context, batch)
                if len(batch.envelopes) > MAX_BATCH_MESSAGES:
                    self._h.note_malformed("Stream")
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"a batch carries at most {MAX_BATCH_MESSAGES} envelopes")
                for envelope in batch.envelopes:
                    try:
                        await self._h.deliver(envelope)
                    except errors.PeerError:
                        pass
        finally:
            self.streams.discard(task)
        return pb.Delivered()

    async def FetchEntries(self, request: pb.FetchEntriesRequest, context: grpc.aio.ServicerContext) -> AsyncIterator:
        # An async generator function: grpc.aio only streams what such a function yields.
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        async for item in _stream(context, self._h.fetch_entries(request)):
            yield item

    async def FetchSnapshot(self, request: pb.FetchSnapshotRequest, context: grpc.aio.ServicerContext) -> AsyncIterator:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        async for item in _stream(context, self._h.fetch_snapshot(request)):
            yield item

    async def Join(self, request: pb.JoinRequest, context: grpc.aio.ServicerContext) -> pb.JoinReply:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        return await _unary(context, self._h.join(request))

    async def Leave(self, request: pb.LeaveRequest, context: grpc.aio.ServicerContext) -> pb.LeaveReply:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        return await _unary(context, self._h.leave(request))

    async def GroupFailed(self, request: pb.GroupFailedRequest, context: grpc.aio.ServicerContext) -> pb.GroupFailedReply:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        return await _unary(context, self._h.group_failed(request))

    async def Force(self, request: pb.ForceRequest, context: grpc.aio.ServicerContext) -> pb.ForceReply:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        return await _unary(context, self._h.force(request))

    async def ReportCheckpoint(self, request: pb.CheckpointReport, context: grpc.aio.ServicerContext) -> pb.CheckpointReply:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        return await _unary(context, self._h.report_checkpoint(request))

    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusReply:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        return await _unary(context, self._h.status())

    async def KvPut(self, request: pb.KvPutRequest, context: grpc.aio.ServicerContext) -> pb.KvPutReply:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        return await _unary(context, self._h.kv_put(request))

    async def KvGet(self, request: pb.KvGetRequest, context: grpc.aio.ServicerContext) -> pb.KvGetReply:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        return await _unary(context, self._h.kv_get(request))

    async def JobControl(self, request: pb.JobControlRequest, context: grpc.aio.ServicerContext) -> pb.JobControlReply:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        return await _unary(context, self._h.job_control(request))

    async def FetchCheckpoint(self, request: pb.FetchCheckpointRequest, context: grpc.aio.ServicerContext) -> AsyncIterator:
        if isinstance(request, Malformed):
            await self._refuse(context, request)
        async for item in _stream(context, self._h.fetch_checkpoint(request)):
            yield item


_UU, _US, _SU = (grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler,
                  grpc.stream_unary_rpc_method_handler)
_TYPES = {
    "Deliver": (pb.Envelope, pb.Delivered, _UU), "Stream": (pb.EnvelopeBatch, pb.Delivered, _SU),
    "FetchEntries": (pb.FetchEntriesRequest, pb.EntryChunk, _US),
    "FetchSnapshot": (pb.FetchSnapshotRequest, pb.SnapshotChunk, _US), "Join": (pb.JoinRequest, pb.JoinReply, _UU),
    "Leave": (pb.LeaveRequest, pb.LeaveReply, _UU), "Status": (pb.StatusRequest, pb.StatusReply, _UU),
    "KvPut": (pb.KvPutRequest, pb.KvPutReply, _UU), "KvGet": (pb.KvGetRequest, pb.KvGetReply, _UU),
    "GroupFailed": (pb.GroupFailedRequest, pb.GroupFailedReply, _UU),
    "Force": (pb.ForceRequest, pb.ForceReply, _UU),
    "ReportCheckpoint": (pb.CheckpointReport, pb.CheckpointReply, _UU),
    "JobControl": (pb.JobControlRequest, pb.JobControlReply, _UU),
    "FetchCheckpoint": (pb.FetchCheckpointRequest, pb.CheckpointChunk, _US),
}


def _add_servicer(servicer: _Servicer, server: grpc.aio.Server) -> None:
    """pbg.add_PeerServicer_to_server, with request deserializers that never raise."""
    handlers = {}
    for method, (request, reply, make) in _TYPES.items():
        handlers[method] = make(getattr(servicer, method), request_deserializer=_safe(method, request.FromString),
                                response_serializer=reply.SerializeToString)
    assert set(handlers) == {m for m in dir(pbg.PeerServicer) if not m.startswith("_")}, "a Peer method is unserved"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("dpeer.v1.Peer", handlers),))
    server.add_registered_method_handlers("dpeer.v1.Peer", handlers)


class PeerServer:
    """A started gRPC server for the Peer service."""

    def __init__(self, server: grpc.aio.Server, servicer: _Servicer) -> None:
        self._server, self._servicer = server, servicer

    async def stop(self, grace: float) -> None:
        """End peers' message streams at once (they carry nothing in flight worth the wait), then
        give other calls up to grace seconds."""
        for task in list(self._servicer.streams):
            task.cancel()
        await self._server.stop(grace=grace)


async def serve(listen: str, handler: PeerHandler, security: Security) -> PeerServer:
    """Bind exactly `listen` and start serving; OSError when the address cannot be bound."""
    interceptors = [TokenCheck(security.token)] if security.token else []
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            *HTTP2_OPTIONS,
        ],
    )
    servicer = _Servicer(handler)
    _add_servicer(servicer, server)
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
    return PeerServer(server, servicer)
