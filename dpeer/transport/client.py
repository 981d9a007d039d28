"""Calls to other nodes: one-way protocol messages to peers, bulk fetches, and operator calls."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections import deque
from typing import Any, AsyncIterator, Callable, Sequence

import grpc

from dpeer import errors
from dpeer.security.auth import SIGNED, Vouch
from dpeer.security.proof import PROOF_HEADER, Signer
from dpeer.transport.options import (
    MAX_BATCH_MESSAGES,
    Security,
    call_metadata,
    forwarding_metadata,
    open_channel,
)
from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.proto.v1 import dpeer_pb2_grpc as pbg
from dpeer.transport import calls, wire

log = logging.getLogger("dpeer.transport")
BATCH_BYTES = 4 * 1024 * 1024
"""A batch stops growing past this many bytes, well below MAX_MESSAGE_BYTES."""

_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.BadRequest,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: errors.Behind,
    grpc.StatusCode.PERMISSION_DENIED: errors.Denied,
    grpc.StatusCode.UNAUTHENTICATED: errors.Denied,
}


def is_refused(exc: grpc.aio.AioRpcError) -> bool:
    """True when the remote port refused the connection: the kernel says no process listens there."""
    details = (exc.details() or "").lower()
    return exc.code() == grpc.StatusCode.UNAVAILABLE and (
        "connection refused" in details or "connection reset" in details
    )


def _tls_reason(details: str) -> str:
    """The short reason inside gRPC's handshake failure text, e.g. 'certificate_verify_failed'."""
    for reason in ("certificate_verify_failed", "wrong_version_number", "certificate_required",
                   "tlsv1_alert_unknown_ca", "sslv3_alert_bad_certificate", "tlsv1_alert_certificate_required"):
        if reason in details:
            return reason.replace("_", " ")
    return "certificate not accepted"


def what_answered(code: str, details: str) -> str | None:
    """What spoke at an address that answered a call, but not as a dpeer node, from gRPC's status
    code name and details; None when the answer was a gRPC server's own (a dpeer node's, most likely)."""
    http = re.search(r"Received http2 header with status: (\d+)", details)
    if http:
        return f"an HTTP/2 server that does not speak gRPC (it answered HTTP status {http.group(1)})"
    if "Failed parsing HTTP/2" in details or "http1.x server" in details:
        return "a server that does not speak HTTP/2 (an HTTP/1 server such as a metrics port, or another protocol)"
    if code == "UNKNOWN" and details == "No status received":
        return "an HTTP/2 server that does not speak gRPC (its answer carried no gRPC status)"
    if code == "UNIMPLEMENTED":
        return "a gRPC server that does not serve this dpeer call: another program, or a dpeer older than this client"
    return None


def translate(exc: grpc.aio.AioRpcError, addr: str) -> errors.PeerError:
    """A gRPC failure as the PeerError a caller can act on."""
    stranger = what_answered(exc.code().name, exc.details() or "")
    if stranger is not None:
        return errors.WrongProtocol(f"{addr} answered, but not as a dpeer node: it is {stranger}")
    cls = _ERRORS.get(exc.code())
    if cls is not None:
        return cls(exc.details() or exc.code().name)
    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.Unreachable(f"node {addr} did not answer in time")
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        if is_refused(exc):
            return errors.Unreachable(f"node {addr} refused the connection", refused=True)
        details = (exc.details() or "").lower()
        if "handshake failed" in details:
            return errors.Denied(f"the TLS handshake with node {addr} failed ({_tls_reason(details)}); "
                                 "check security.tls_cert, tls_key and tls_ca in --config")
        if "socket closed" in details:
            return errors.Unreachable(f"node {addr} closed the connection (does it require TLS? pass --config)")
        return errors.Unreachable(f"node {addr} is unreachable")
    return errors.PeerError(f"node {addr} failed the call: {exc.code().name}: {exc.details()}")


class Channels:
    """One channel and stub per address, reused across calls, closed together; the signer of the
    proofs the commands a node may forward carry (security/proof.py) when there is a key."""

    def __init__(self, security: Security) -> None:
        self._security = security
        self._stubs: dict[str, tuple[grpc.aio.Channel, pbg.PeerStub]] = {}
        self.metadata = call_metadata(security)
        self.signer = Signer(security.cert, security.key) if security.cert and security.key else None

    def stub(self, addr: str) -> pbg.PeerStub:
        """The stub for addr, opening its channel on first use."""
        if addr not in self._stubs:
            channel = open_channel(addr, self._security)
            self._stubs[addr] = (channel, pbg.PeerStub(channel))
        return self._stubs[addr][1]

    async def drop(self, addr: str) -> None:
        """Close the channel to addr (a node that left for good)."""
        entry = self._stubs.pop(addr, None)
        if entry is not None:
            await entry[0].close()

    async def close(self) -> None:
        """Close every channel."""
        for addr in list(self._stubs):
            await self.drop(addr)


class _Link:
    """One peer's outgoing side: a bounded queue of envelopes and the Stream call that carries them."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.queue: deque[pb.Envelope] = deque()
        self.wake = asyncio.Event()
        self.call: grpc.aio.StreamUnaryCall | None = None
        self.established = False  # the current call reached the peer (its initial metadata came back)


class PeerSender:
    """Fire-and-forget delivery of protocol messages, with a bound on what waits per peer.

    Each peer gets one long-lived client stream (Peer.Stream); what is queued for it in one loop
    turn leaves as one EnvelopeBatch.
    A refused connection is reported at once through `on_refused(addr)`: it is the strongest
    evidence of a dead process there is, and arrives in about a millisecond on a LAN. A stream
    that breaks after it was established is reopened at once, so a dead peer's refusal is seen
    without waiting for the next message.
    """

    def __init__(
        self, channels: Channels, on_refused: Callable[[str], None], timeout: float = 1.0,
        max_in_flight: int = 64, on_rtt: Callable[[float], None] | None = None,
    ) -> None:
        self._channels = channels
        self._on_refused = on_refused
        self._on_rtt = on_rtt
        self._timeout = timeout
        self._max = max_in_flight
        self._links: dict[str, _Link] = {}
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self.dropped = 0
        self.batches = 0  # EnvelopeBatches written to streams

    def send(self, addr: str, envelope: pb.Envelope) -> None:
        """Queue one envelope to addr; dropped (like a lost datagram) when addr has too many waiting
        or is not a usable HOST:PORT (a peer that sent an empty or forged from_addr)."""
        if not addr or ":" not in addr or self._closed:
            self.dropped += 1
            return
        link = self._links.get(addr)
        if link is None:
            link = self._links[addr] = _Link(addr)
            self._spawn(self._pump(link))
        if len(link.queue) >= self._max or self._closed:
            self.dropped += 1
            return
        link.queue.append(envelope)
        link.wake.set()

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _pump(self, link: _Link) -> None:
        """Send what is queued for link.addr, one batch per write, until the sender closes."""
        while not self._closed:
            await link.wake.wait()
            link.wake.clear()
            while link.queue:
                call = link.call or self._open(link)
                batch = _take(link.queue)
                try:
                    await call.write(batch)
                    self.batches += 1
                except grpc.aio.AioRpcError as exc:
                    self._broken(link, call, exc)
                except asyncio.InvalidStateError:
                    if link.call is call:
                        link.call = None

    def _open(self, link: _Link) -> grpc.aio.StreamUnaryCall:
        call = self._channels.stub(link.addr).Stream(metadata=self._channels.metadata)
        link.call, link.established = call, False
        self._spawn(self._watch(link, call))
        return call

    async def _watch(self, link: _Link, call: grpc.aio.StreamUnaryCall) -> None:
        """Wait for the peer's first answer on the call (a round trip), then for the call's end."""
        started = time.monotonic()
        try:
            await call.initial_metadata()
            if not call.done():
                link.established = link.established or link.call is call
                if self._on_rtt is not None:
                    self._on_rtt(time.monotonic() - started)
            await call
        except grpc.aio.AioRpcError as exc:
            self._broken(link, call, exc)
            return
        except asyncio.CancelledError:
            return
        if link.call is call:
            link.call = None

    def _broken(self, link: _Link, call: grpc.aio.StreamUnaryCall, exc: grpc.aio.AioRpcError) -> None:
        """The stream ended in error: report a refusal, or reopen at once."""
        if link.call is not call:
            return
        link.call, was_established = None, link.established
        code = exc.code()
        if is_refused(exc):
            self._on_refused(link.addr)
        elif code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
            log.warning("peer %s ended our message stream: %s: %s", link.addr, code.name, exc.details())
        elif was_established and not self._closed:
            self._open(link)

    async def close(self) -> None:
        """Cancel the streams and the deliveries still waiting."""
        self._closed = True
        for link in self._links.values():
            if link.call is not None:
                link.call.cancel()
            link.wake.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _take(queue: deque[pb.Envelope]) -> pb.EnvelopeBatch:
    """The next batch off queue: at most MAX_BATCH_MESSAGES envelopes and BATCH_BYTES (one at least)."""
    batch, size = pb.EnvelopeBatch(), 0
    while queue and len(batch.envelopes) < MAX_BATCH_MESSAGES:
        n = queue[0].ByteSize()
        if batch.envelopes and size + n > BATCH_BYTES:
            break
        batch.envelopes.append(queue.popleft())
        size += n
    return batch


class NodeClient:
    """Request/response calls to one node, raising PeerErrors with one clear sentence."""

    def __init__(
        self, addr: str, security: Security | None = None, timeout: float = 5.0, channels: Channels | None = None,
        on_behalf_of: Vouch | None = None,
    ) -> None:
        """on_behalf_of: the caller a node forwards this command for, with its proof (security.auth)."""
        self.addr = addr
        self._channels = channels or Channels(security or Security())
        self._own = channels is None
        self._timeout = timeout
        self._forwarding = on_behalf_of is not None
        self._metadata = forwarding_metadata(self._channels.metadata, on_behalf_of)

    async def __aenter__(self) -> "NodeClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._own:
            await self._channels.close()

    def _signed(self, method: str, request: object) -> tuple[tuple[str, str], ...]:
        """The call's metadata: a command a node may forward carries our proof (a forwarded one
        carries its caller's instead, already in the metadata)."""
        signer = self._channels.signer
        if method not in SIGNED or signer is None or self._forwarding:
            return self._metadata
        return self._metadata + ((PROOF_HEADER, signer.sign(method, request, time.time(), os.urandom(16))),)

    async def _call(self, method: str, request: object, timeout: float | None = None) -> Any:
        rpc = getattr(self._channels.stub(self.addr), method)
        try:
            reply = await rpc(request, timeout=timeout or self._timeout, metadata=self._signed(method, request))
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, self.addr) from None
        return wire.parsed(reply)

    async def status(self) -> calls.StatusReply:
        """The node's status document."""
        return await self._call("Status", pb.StatusRequest())

    async def kv_put(self, key: str, value: str, timeout: float | None = None) -> calls.KvPutReply:
        """Commit key=value through the node."""
        return await self._call("KvPut", pb.KvPutRequest(key=key, value=value), timeout)

    async def kv_get(self, key: str) -> calls.KvGetReply:
        """A linearizable read of key through the node."""
        return await self._call("KvGet", pb.KvGetRequest(key=key))

    async def kv_delete(self, key: str, timeout: float | None = None) -> calls.KvDeleteReply:
        """Commit the removal of key through the node."""
        return await self._call("KvDelete", pb.KvDeleteRequest(key=key), timeout)

    async def kv_list(self, prefix: str = "") -> calls.KvListReply:
        """A linearizable read of every key starting with prefix, through the node."""
        return await self._call("KvList", pb.KvListRequest(prefix=prefix))

    async def join(self, node_id: str, addr: str, store_port: int = 0, ready: bool = True, uid: str = "",
                   boot: str = "", up: float = 0.0, site: str = "", near: Sequence[str] = (),
                   speed_class: int | None = None) -> calls.JoinReply:
        """Ask the node to admit node_id at addr (its worker's store on store_port, ready or not; its
        store uid, its daemon's boot and that daemon's age)."""
        request = pb.JoinRequest(node_id=node_id, addr=addr, store_port=store_port, ready=ready, uid=uid, boot=boot,
                                 up=up, site=site, near=list(near), speed_class=speed_class)
        return await self._call("Join", request)

    async def force(self, voters: list[str]) -> calls.ForceReply:
        """Force the node to make `voters` the whole voting configuration (unsafe; docs/recovery.md)."""
        return await self._call("Force", pb.ForceRequest(voters=voters, confirm=True))

    async def group_failed(self, request: calls.GroupFailedRequest) -> calls.GroupFailedReply:
        """Tell the node (forwarded to the leader) that a group failed or a job's build did."""
        return await self._call("GroupFailed", wire.to_wire(request))

    async def report_checkpoint(self, node_id: str, step: int, digest: str, final: bool = False) -> calls.CheckpointReply:
        """Tell the node (forwarded to the leader) that node_id holds the checkpoint of step."""
        report = pb.CheckpointReport(node_id=node_id, step=step, digest=digest, final=final)
        return await self._call("ReportCheckpoint", report)

    async def job_control(self, action: str) -> calls.JobControlReply:
        """An operator's job command (`retry`), committed through the leader."""
        return await self._call("JobControl", pb.JobControlRequest(action=action))

    async def fetch_checkpoint(self, step: int, offset: int = 0, timeout: float = 120.0) -> AsyncIterator[calls.CheckpointChunk]:
        """Stream the node's checkpoint file of `step` from offset on."""
        request = pb.FetchCheckpointRequest(step=step, offset=offset)
        call = self._channels.stub(self.addr).FetchCheckpoint(request, timeout=timeout, metadata=self._channels.metadata)
        try:
            async for chunk in call:
                yield wire.parsed(chunk)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, self.addr) from None

    async def leave(self, node_id: str = "", forwarded: bool = False) -> calls.LeaveReply:
        """Ask the node to leave (node_id empty); forwarded: commit node_id's leave on the leader."""
        return await self._call("Leave", pb.LeaveRequest(node_id=node_id, forwarded=forwarded))

    async def fetch_entries(self, from_index: int, to_index: int, node_id: str, timeout: float = 30.0) -> AsyncIterator[calls.EntryChunk]:
        """Stream committed entries [from_index, to_index] from the node."""
        request = pb.FetchEntriesRequest(node_id=node_id, from_index=from_index, to_index=to_index)
        call = self._channels.stub(self.addr).FetchEntries(request, timeout=timeout, metadata=self._metadata)
        try:
            async for chunk in call:
                yield wire.parsed(chunk)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, self.addr) from None
