"""Serves the dpeer.v1.Peer service: validates the caller, hands requests to a PeerHandler."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import AsyncIterator, Awaitable, Callable, Protocol

import grpc

from dpeer.security import auth, proof

from dpeer import errors
from dpeer.transport.options import (
    HTTP2_OPTIONS,
    MAX_BATCH_MESSAGES,
    MAX_MESSAGE_BYTES,
    TOKEN_HEADER,
    Security,
)
from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.proto.v1 import dpeer_pb2_grpc as pbg
from dpeer.transport import calls, codec, wire
from dpeer.transport.api import Envelope

log = logging.getLogger("dpeer.transport")

_CODES = {
    errors.BadRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Behind: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Denied: grpc.StatusCode.PERMISSION_DENIED,
}


class PeerHandler(Protocol):
    """What the daemon implements, in calls.py's dataclasses and the cores' messages (the servicer
    converts the wire's protobuf); raise errors.PeerError subclasses to refuse a call."""

    def note_malformed(self, method: str) -> None:
        """Count a request whose bytes did not decode, or an envelope that is not valid (the
        transport already refused it)."""

    async def deliver(self, envelope: Envelope) -> None:
        """Take one protocol message (probe, ack, Raft) from a peer."""

    def fetch_entries(self, request: calls.FetchEntriesRequest) -> AsyncIterator[calls.EntryChunk]:
        """Stream committed entries from request.from_index on."""

    async def join(self, request: calls.JoinRequest) -> calls.JoinReply:
        """Admit a node to the cluster (through the leader)."""

    async def leave(self, request: calls.LeaveRequest) -> calls.LeaveReply:
        """Remove a node (this one when node_id is empty) gracefully."""

    async def group_failed(self, request: calls.GroupFailedRequest) -> calls.GroupFailedReply:
        """A worker's group failed: re-form it under a new generation."""

    async def force(self, request: calls.ForceRequest) -> calls.ForceReply:
        """Operator's forced reconfiguration to the given voters (unsafe, logged)."""

    async def report_checkpoint(self, request: calls.CheckpointReport) -> calls.CheckpointReply:
        """A node holds a checkpoint (through the leader, which records it once a majority does)."""

    def node_id(self) -> str:
        """This node's id (a call in its own name is never forwarded to it)."""

    def may_forward(self, node_id: str) -> bool:
        """Whether node_id is a member of the cluster: only a member's certificate forwards commands
        (judged as the callers it names) and reads the log and checkpoints; a stranger's or a
        retired box's does neither."""

    async def status(self) -> calls.StatusReply:
        """This node's status document."""

    async def kv_put(self, request: calls.KvPutRequest) -> calls.KvPutReply:
        """Commit a setting; answer once it is committed."""

    async def kv_get(self, request: calls.KvGetRequest) -> calls.KvGetReply:
        """A linearizable read of a setting."""

    async def kv_delete(self, request: calls.KvDeleteRequest) -> calls.KvDeleteReply:
        """Commit a setting's removal; answer once it is committed."""

    async def kv_list(self, request: calls.KvListRequest) -> calls.KvListReply:
        """A linearizable read of the settings under a prefix."""

    async def job_control(self, request: calls.JobControlRequest) -> calls.JobControlReply:
        """An operator's job command (retry a failed job), committed through the leader."""

    def fetch_checkpoint(self, request: calls.FetchCheckpointRequest) -> AsyncIterator[calls.CheckpointChunk]:
        """Stream a checkpoint file this node holds, from request.offset on."""


class Guard:
    """Admits or refuses each call before its handler runs: the cluster token, the caller's role from
    its certificate, a member's certificate for the log, the node ids the request speaks for, and a
    forwarded call's proof (dpeer.security.auth). Every refusal is counted by method and reason, and logged once per peer,
    method and reason per interval."""

    def __init__(self, security: Security, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.mode = security.mode
        self._token = security.token.encode() if security.token else None
        self._clock, self._wall = clock, wall
        self._quiet = auth.RefusalLog()
        self._proofs = proof.Verifier(security.ca) if security.ca is not None else None
        self.refusals: dict[tuple[str, auth.Refusal], int] = {}

    def principal(self, context: grpc.aio.ServicerContext, method: str, receiver: str,
                  may_forward: Callable[[str], bool]) -> auth.Caller | tuple[auth.Refusal, str]:
        """Who calls (after the token gate), or why the call is refused before it is even read;
        a forwarded call is judged as the caller the forwarding node names (auth.effective), and
        only a member's node certificate reads the log (auth.member_only)."""
        metadata = dict(context.invocation_metadata() or ())
        if self._token is not None and not hmac.compare_digest(str(metadata.get(TOKEN_HEADER, "")).encode(),
                                                               self._token):
            return auth.Refusal.UNAUTHENTICATED, "this cluster requires its cluster token (missing or wrong)"
        if self.mode in (auth.Mode.MTLS, auth.Mode.MTLS_TOKEN):
            uris = [u.decode(errors="replace") for u in context.auth_context().get("peer_uri", ())]
            caller = auth.principal_from_uris(uris)
            outsider = auth.member_only(caller, method, may_forward)
            if outsider is not None:
                return outsider
            judged = auth.effective(caller, metadata.get(auth.ON_BEHALF_OF), method, receiver, may_forward)
            if isinstance(judged, tuple):
                return judged
            given = metadata.get(proof.PROOF_HEADER)
            return auth.Caller(judged, caller if judged != caller else None, str(given) if given else None)
        return auth.Caller(auth.Principal(auth.CallerRole.TOKEN) if self._token is not None else auth.ANONYMOUS)

    def proven(self, caller: auth.Caller, method: str, request: object,
               receiver: str) -> auth.Caller | tuple[auth.Refusal, str]:
        """Who the call stands as once the policy allows it, or why it is refused. A forwarded call
        within its node's own rights stands as the node's own; beyond them it stands as the caller
        it names only with that caller's proof (security/proof.py), checked last, once the named
        caller may make the call at all, so that a refused caller's proof takes no nonce."""
        if caller.via is not None and not auth.beyond_the_node(self.mode, method, request, caller):
            caller = auth.Caller(caller.via)
        refused = auth.authorize(self.mode, method, request, caller.principal)
        if refused is not None:
            return refused
        if caller.via is None:
            return caller
        assert self._proofs is not None  # a call is forwarded only under mutual TLS
        problem = self._proofs.check(caller.proof, method, request, caller.principal, self._wall())
        return caller if problem is None else auth.unproven(receiver, method, caller.via, caller.principal, problem)

    def failed(self, caller: auth.Caller) -> None:
        """A proven call's handler failed (no leader, no quorum): the caller's node may try it again
        with the same proof, as it tries every forwarded command again, so its nonce is let go."""
        if caller.via is not None and caller.proof is not None and self._proofs is not None:
            self._proofs.forget(caller.proof, caller.principal)

    def refuse(self, context: grpc.aio.ServicerContext, method: str, refusal: auth.Refusal, why: str,
               caller: auth.Principal | None = None) -> None:
        """Count a refusal and log it unless this peer's refusals of this method were logged lately."""
        key = (method, refusal)
        self.refusals[key] = self.refusals.get(key, 0) + 1
        peer = _peer_host(context.peer() or "")
        held = self._quiet.should_log(peer, f"{method}/{refusal.value}", self._clock())
        if held is not None:
            more = f" ({held} more from this peer since the last such line)" if held else ""
            log.warning("refused a call to %s from %s (%s): %s: %s%s", method, peer, caller or "unauthenticated",
                        refusal.value, why, more)


def _peer_host(peer: str) -> str:
    """ipv4:1.2.3.4:5678 -> 1.2.3.4 (a fuzzer's fresh connections share one key)."""
    kind, _, rest = peer.partition(":")
    return rest.rsplit(":", 1)[0] if kind in ("ipv4", "ipv6") else peer[:80]


_ABORT_CODES = {auth.Refusal.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
                auth.Refusal.FORBIDDEN: grpc.StatusCode.PERMISSION_DENIED,
                auth.Refusal.IDENTITY: grpc.StatusCode.PERMISSION_DENIED,
                auth.Refusal.INVALID: grpc.StatusCode.INVALID_ARGUMENT}


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


_HANDLERS = {"Deliver": "deliver", "Join": "join", "Leave": "leave", "GroupFailed": "group_failed",
             "Force": "force", "ReportCheckpoint": "report_checkpoint", "KvPut": "kv_put", "KvGet": "kv_get",
             "KvDelete": "kv_delete", "KvList": "kv_list",
             "FetchEntries": "fetch_entries", "JobControl": "job_control",
             "FetchCheckpoint": "fetch_checkpoint"}


class _Servicer:
    """Adapts gRPC calls to the handler: the Guard admits each call (token, role, claimed node ids)
    before the handler sees it, and PeerErrors become status codes.

    Undecodable request bytes are answered INVALID_ARGUMENT (not gRPC's UNKNOWN with a Python
    exception text), counted through the handler's `note_malformed`, and logged as refusals.
    """

    def __init__(self, handler: PeerHandler, guard: Guard) -> None:
        self._h = handler
        self.guard = guard
        self.streams: set[asyncio.Task] = set()

    async def _abort(self, context: grpc.aio.ServicerContext, method: str, refusal: auth.Refusal, why: str,
                     caller: auth.Principal | None = None) -> None:
        self.guard.refuse(context, method, refusal, why, caller)
        await context.abort(_ABORT_CODES[refusal], why)

    async def _admit(self, method: str, request: object, context: grpc.aio.ServicerContext) -> auth.Caller:
        """The caller, once the token, the request's shape, the policy and a forwarded call's proof
        all allow the call (else abort)."""
        receiver = self._h.node_id()
        caller = self.guard.principal(context, method, receiver, self._h.may_forward)
        if isinstance(caller, tuple):
            await self._abort(context, method, *caller)
        assert isinstance(caller, auth.Caller)
        if isinstance(request, Malformed):
            self._h.note_malformed(method)
            await self._abort(context, method, auth.Refusal.INVALID,
                              f"undecodable {method} request: not a valid protobuf message ({request.size} "
                              f"bytes: {request.reason})", caller.principal)
        proven = self.guard.proven(caller, method, request, receiver)
        if isinstance(proven, tuple):
            await self._abort(context, method, *proven, caller.via or caller.principal)
        assert isinstance(proven, auth.Caller)
        auth.CALLER.set(proven)
        return proven

    async def _failed(self, context: grpc.aio.ServicerContext, method: str, exc: errors.PeerError,
                      caller: auth.Caller) -> None:
        self.guard.failed(caller)
        if isinstance(exc, errors.BadRequest):
            self.guard.refuse(context, method, auth.Refusal.INVALID, str(exc), caller.principal)
        await context.abort(_CODES.get(type(exc), grpc.StatusCode.UNKNOWN), str(exc))

    def unary(self, method: str) -> Callable[[object, grpc.aio.ServicerContext], Awaitable[object]]:
        """The gRPC handler of a unary method."""
        reply = _TYPES[method][1]

        async def call(request: object, context: grpc.aio.ServicerContext) -> object:
            caller = await self._admit(method, request, context)
            try:
                if method == "Status":
                    return wire.to_wire(await self._h.status())
                result = await getattr(self._h, _HANDLERS[method])(self._request(method, request))
                return reply() if result is None else wire.to_wire(result)
            except errors.PeerError as exc:
                await self._failed(context, method, exc, caller)
            except asyncio.CancelledError:
                self.guard.failed(caller)  # the caller gave up (its deadline): it may try again
                raise

        return call

    def _request(self, method: str, request: object) -> object:
        """The handler's form of an admitted request: a Deliver's Envelope decoded and validated
        (BadRequest, counted as malformed, when it is not), a call's dataclass."""
        if method == "Deliver":
            return self._envelope(method, request)
        return wire.from_wire(_CALLS[method], request)

    def _envelope(self, method: str, envelope: object) -> Envelope:
        assert isinstance(envelope, pb.Envelope)
        try:
            return codec.decode(envelope)
        except errors.BadRequest:
            self._h.note_malformed(method)
            raise

    def streaming(self, method: str) -> Callable[[object, grpc.aio.ServicerContext], AsyncIterator[object]]:
        """The gRPC handler of a server-streaming fetch (an async generator: grpc.aio streams only those)."""

        async def call(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
            caller = await self._admit(method, request, context)
            try:
                async for item in getattr(self._h, _HANDLERS[method])(self._request(method, request)):
                    yield wire.to_wire(item)
            except errors.PeerError as exc:
                await self._failed(context, method, exc, caller)

        return call

    async def Stream(self, requests: AsyncIterator[object], context: grpc.aio.ServicerContext) -> pb.Delivered:
        """Each batch's envelopes are delivered in order, each as Deliver would; one that the handler
        refuses is counted and logged (quietly) and the stream goes on. An undecodable or oversized
        batch, or one that speaks for another node, ends the stream."""
        task = asyncio.current_task()
        if task is not None:
            self.streams.add(task)
        try:
            caller = (await self._admit("Stream", pb.EnvelopeBatch(), context)).principal
            await context.send_initial_metadata(())
            async for batch in requests:
                await self._batch(batch, caller, context)
        finally:
            self.streams.discard(task)
        return pb.Delivered()

    async def _batch(self, batch: object, caller: auth.Principal, context: grpc.aio.ServicerContext) -> None:
        if isinstance(batch, Malformed):
            self._h.note_malformed("Stream")
            await self._abort(context, "Stream", auth.Refusal.INVALID, "undecodable Stream batch: not a valid "
                              f"protobuf message ({batch.size} bytes: {batch.reason})", caller)
        assert isinstance(batch, pb.EnvelopeBatch)
        if len(batch.envelopes) > MAX_BATCH_MESSAGES:
            self._h.note_malformed("Stream")
            await self._abort(context, "Stream", auth.Refusal.INVALID,
                              f"a batch carries at most {MAX_BATCH_MESSAGES} envelopes", caller)
        refused = auth.authorize(self.guard.mode, "Stream", batch, caller)
        if refused is not None:
            await self._abort(context, "Stream", *refused, caller)
        for envelope in batch.envelopes:
            try:
                await self._h.deliver(self._envelope("Stream", envelope))
            except errors.PeerError as exc:
                self.guard.refuse(context, "Stream", auth.Refusal.INVALID, str(exc), caller)


_UU, _US, _SU = (grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler,
                  grpc.stream_unary_rpc_method_handler)
_TYPES = {
    "Deliver": (pb.Envelope, pb.Delivered, _UU), "Stream": (pb.EnvelopeBatch, pb.Delivered, _SU),
    "FetchEntries": (pb.FetchEntriesRequest, pb.EntryChunk, _US),
    "Join": (pb.JoinRequest, pb.JoinReply, _UU),
    "Leave": (pb.LeaveRequest, pb.LeaveReply, _UU), "Status": (pb.StatusRequest, pb.StatusReply, _UU),
    "KvPut": (pb.KvPutRequest, pb.KvPutReply, _UU), "KvGet": (pb.KvGetRequest, pb.KvGetReply, _UU),
    "KvDelete": (pb.KvDeleteRequest, pb.KvDeleteReply, _UU), "KvList": (pb.KvListRequest, pb.KvListReply, _UU),
    "GroupFailed": (pb.GroupFailedRequest, pb.GroupFailedReply, _UU),
    "Force": (pb.ForceRequest, pb.ForceReply, _UU),
    "ReportCheckpoint": (pb.CheckpointReport, pb.CheckpointReply, _UU),
    "JobControl": (pb.JobControlRequest, pb.JobControlReply, _UU),
    "FetchCheckpoint": (pb.FetchCheckpointRequest, pb.CheckpointChunk, _US),
}

_CALLS = {method: getattr(calls, request.__name__) for method, (request, _, _) in _TYPES.items()
          if method not in ("Deliver", "Stream", "Status")}


def _add_servicer(servicer: _Servicer, server: grpc.aio.Server) -> None:
    """Every Peer method, guarded, with request deserializers that never raise."""
    handlers = {}
    for method, (request, reply, make) in _TYPES.items():
        fn = servicer.Stream if make is _SU else servicer.streaming(method) if make is _US else servicer.unary(method)
        handlers[method] = make(fn, request_deserializer=_safe(method, request.FromString),
                                response_serializer=reply.SerializeToString)
    assert set(handlers) == {m for m in dir(pbg.PeerServicer) if not m.startswith("_")}, "a Peer method is unserved"
    assert set(handlers) == set(auth.NEEDS), "a Peer method has no access policy"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("dpeer.v1.Peer", handlers),))
    server.add_registered_method_handlers("dpeer.v1.Peer", handlers)


class PeerServer:
    """A started gRPC server for the Peer service."""

    def __init__(self, server: grpc.aio.Server, servicer: _Servicer) -> None:
        self._server, self._servicer = server, servicer

    @property
    def refusals(self) -> dict[tuple[str, auth.Refusal], int]:
        """Calls refused so far, by method and reason."""
        return self._servicer.guard.refusals

    async def stop(self, grace: float) -> None:
        """End peers' message streams at once (they carry nothing in flight worth the wait), then
        give other calls up to grace seconds."""
        for task in list(self._servicer.streams):
            task.cancel()
        await self._server.stop(grace=grace)


async def serve(listen: str, handler: PeerHandler, security: Security) -> PeerServer:
    """Bind exactly `listen` and start serving; OSError when the address cannot be bound."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            *HTTP2_OPTIONS,
        ],
    )
    servicer = _Servicer(handler, Guard(security))
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
