"""Calls to other nodes: one-way protocol messages to peers, bulk fetches, and operator calls."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Callable

import grpc

from dpeer.peer import errors
from dpeer.peer.transport.faults import FaultHook
from dpeer.peer.transport.options import Security, call_metadata, open_channel
from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.proto.v1 import dpeer_pb2_grpc as pbg

log = logging.getLogger("dpeer.transport")

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


def translate(exc: grpc.aio.AioRpcError, addr: str) -> errors.PeerError:
    """A gRPC failure as the PeerError a caller can act on."""
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
    """One channel and stub per address, reused across calls, closed together."""

    def __init__(self, security: Security) -> None:
        self._security = security
        self._stubs: dict[str, tuple[grpc.aio.Channel, pbg.PeerStub]] = {}
        self.metadata = call_metadata(security)

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


class PeerSender:
    """Fire-and-forget delivery of protocol messages, with a bound on what waits per peer.

    A refused connection is reported at once through `on_refused(addr)`: it is the strongest
    evidence of a dead process there is, and arrives in about a millisecond on a LAN.
    """

    def __init__(
        self, channels: Channels, on_refused: Callable[[str], None], timeout: float = 1.0,
        max_in_flight: int = 64, faults: FaultHook | None = None,
        on_rtt: Callable[[float], None] | None = None,
    ) -> None:
        self._channels = channels
        self._faults = faults  # test-only fault injection (transport/faults.py); None in production
        self._on_refused = on_refused
        self._on_rtt = on_rtt
        self._timeout = timeout
        self._max = max_in_flight
        self._in_flight: dict[str, int] = {}
        self._tasks: set[asyncio.Task] = set()
        self.dropped = 0

    def send(self, addr: str, envelope: pb.Envelope) -> None:
        """Queue one envelope to addr; dropped (like a lost datagram) when addr has too many waiting
        or is not a usable HOST:PORT (a peer that sent an empty or forged from_addr)."""
        if not addr or ":" not in addr or self._in_flight.get(addr, 0) >= self._max:
            self.dropped += 1
            return
        delay = self._faults.verdict(addr) if self._faults is not None else 0.0
        if delay is None:
            self.dropped += 1
            return
        self._in_flight[addr] = self._in_flight.get(addr, 0) + 1
        task = asyncio.get_running_loop().create_task(self._deliver(addr, envelope, delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, addr: str, envelope: pb.Envelope, delay: float = 0.0) -> None:
        try:
            if delay:
                await asyncio.sleep(delay)
            started = time.monotonic()
            await self._channels.stub(addr).Deliver(
                envelope, timeout=self._timeout, metadata=self._channels.metadata
            )
            if self._on_rtt is not None:
                self._on_rtt(time.monotonic() - started)
        except grpc.aio.AioRpcError as exc:
            if is_refused(exc):
                self._on_refused(addr)
            elif exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                log.warning("peer %s rejected a %s: %s", addr, envelope.WhichOneof("body"), exc.details())
        finally:
            self._in_flight[addr] -= 1

    async def close(self) -> None:
        """Cancel deliveries still waiting."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class NodeClient:
    """Request/response calls to one node, raising PeerErrors with one clear sentence."""

    def __init__(
        self, addr: str, security: Security | None = None, timeout: float = 5.0, channels: Channels | None = None
    ) -> None:
        self.addr = addr
        self._channels = channels or Channels(security or Security())
        self._own = channels is None
        self._timeout = timeout

    async def __aenter__(self) -> "NodeClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._own:
            await self._channels.close()

    async def _call(self, method: str, request: object, timeout: float | None = None) -> object:
        rpc = getattr(self._channels.stub(self.addr), method)
        try:
            return await rpc(request, timeout=timeout or self._timeout, metadata=self._channels.metadata)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, self.addr) from None

    async def status(self) -> pb.StatusReply:
        """The node's status document."""
        return await self._call("Status", pb.StatusRequest())

    async def kv_put(self, key: str, value: str, timeout: float | None = None) -> pb.KvPutReply:
        """Commit key=value through the node."""
        return await self._call("KvPut", pb.KvPutRequest(key=key, value=value), timeout)

    async def kv_get(self, key: str) -> pb.KvGetReply:
        """A linearizable read of key through the node."""
        return await self._call("KvGet", pb.KvGetRequest(key=key))

    async def join(self, node_id: str, addr: str, store_port: int = 0, ready: bool = True) -> pb.JoinReply:
        """Ask the node to admit node_id at addr (its worker's store on store_port, ready or not)."""
        request = pb.JoinRequest(node_id=node_id, addr=addr, store_port=store_port, ready=ready)
        return await self._call("Join", request)

    async def force(self, voters: list[str]) -> pb.ForceReply:
        """Force the node to make `voters` the whole voting configuration (unsafe; see README)."""
        return await self._call("Force", pb.ForceRequest(voters=voters, confirm=True))

    async def group_failed(self, node_id: str, generation: int, reason: str) -> pb.GroupFailedReply:
        """Tell the node (forwarded to the leader) that the group of `generation` failed."""
        request = pb.GroupFailedRequest(node_id=node_id, generation=generation, reason=reason[:500])
        return await self._call("GroupFailed", request)

    async def report_checkpoint(self, node_id: str, step: int, digest: str) -> pb.CheckpointReply:
        """Tell the node (forwarded to the leader) that node_id holds the checkpoint of step."""
        return await self._call("ReportCheckpoint", pb.CheckpointReport(node_id=node_id, step=step, digest=digest))

    async def leave(self, node_id: str = "", forwarded: bool = False) -> pb.LeaveReply:
        """Ask the node to leave (node_id empty); forwarded: commit node_id's leave on the leader."""
        return await self._call("Leave", pb.LeaveRequest(node_id=node_id, forwarded=forwarded))

    async def fetch_entries(self, from_index: int, to_index: int, node_id: str, timeout: float = 30.0) -> AsyncIterator[pb.EntryChunk]:
        """Stream committed entries [from_index, to_index] from the node."""
        request = pb.FetchEntriesRequest(node_id=node_id, from_index=from_index, to_index=to_index)
        call = self._channels.stub(self.addr).FetchEntries(request, timeout=timeout, metadata=self._channels.metadata)
        try:
            async for chunk in call:
                yield chunk
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, self.addr) from None

    async def fetch_snapshot(self, node_id: str, offset: int = 0, timeout: float = 60.0) -> AsyncIterator[pb.SnapshotChunk]:
        """Stream the node's newest snapshot from offset on."""
        request = pb.FetchSnapshotRequest(node_id=node_id, offset=offset)
        call = self._channels.stub(self.addr).FetchSnapshot(request, timeout=timeout, metadata=self._channels.metadata)
        try:
            async for chunk in call:
                yield chunk
        except grpc.aio.AioRpcError as exc:
            raise translate(exc, self.addr) from None
