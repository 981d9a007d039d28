"""An in-memory network for many daemons in one process: the whole-cluster simulation's transport.

Envelopes and request/response calls go straight to the target daemon's Service (the handler
the gRPC server would call), in the api's and calls.py's dataclasses (no protobuf on the way),
after the delay a seeded SimNetwork gives the link, or not at all
when the link is cut (partitions, also one-way) or the message is lost. Each link keeps the
order of its envelopes, as the production stream does. A daemon that is not attached (down)
refuses: senders learn it after `refused_delay`, as a closed port tells them, and so do the
daemons whose envelope stream to it was open when it went (the kernel resets a dead process's
connections; the production sender reports that as a refusal). A paused daemon
(SIGSTOP) holds what arrives until it resumes. Errors cross a call as they cross gRPC: the
PeerError types the client maps back arrive as such, Unavailable as Unreachable, any other as
PeerError; an exception that is no PeerError is a bug in a handler and is recorded in `crashes`.
An envelope passes the checks the gRPC server makes (transport/checks.py), its log entries
rebuilt from their encoded form as the wire delivers them; one that fails them is refused as the
server refuses it, and recorded in `crashes` too: only a buggy core sends one here. Fetched entry
chunks are rebuilt the same way.
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

from dpeer import errors
from dpeer.security.auth import Vouch
from dpeer.sim.network import SimNetwork
from dpeer.transport import calls, checks
from dpeer.transport.api import Envelope, Refused

_SAME = (errors.BadRequest, errors.NotFound, errors.Behind, errors.Denied)


@dataclass
class Host:
    """One attached daemon: its node id, its handler (a daemon Service) and the context its
    work runs in (so whoever owns the context can cancel it all, as a crash does)."""

    node_id: str
    handler: Any
    context: contextvars.Context
    paused: bool = False
    held: list[Callable[[], None]] = field(default_factory=list)


class MemoryNetwork:
    """Routes envelopes and calls between the attached daemons; see the module docstring."""

    def __init__(self, links: SimNetwork, refused_delay: float = 0.001) -> None:
        self.links = links
        self.refused_delay = refused_delay
        self.hosts: dict[str, Host] = {}  # by address
        self.crashes: list[str] = []
        self.sent = self.delivered = self.dropped = 0
        self._last_arrival: dict[tuple[str, str], float] = {}
        self._streams: dict[str, dict[str, MemoryTransport]] = {}  # addr -> senders with a stream to it

    def attach(self, addr: str, node_id: str, handler: Any, context: contextvars.Context | None = None) -> None:
        """Serve `handler` (a Service) at addr from now on."""
        self.hosts[addr] = Host(node_id, handler, context or contextvars.copy_context())

    def detach(self, addr: str) -> None:
        """The daemon at addr is gone: what is on its way there is lost, new sends are refused,
        and the senders whose stream to it is open (over a link that is not cut) learn it now."""
        host = self.hosts.pop(addr, None)
        streams = self._streams.pop(addr, {})
        if host is None:
            return
        loop = asyncio.get_running_loop()
        for src in streams.values():
            if self.links.route(host.node_id, src.node_id) is not None:
                loop.call_later(self.refused_delay, src.refused, addr)

    def node_at(self, addr: str) -> str | None:
        """The node id attached at addr."""
        host = self.hosts.get(addr)
        return host.node_id if host is not None else None

    def pause(self, addr: str) -> None:
        """Hold what arrives at addr until resume(addr)."""
        self.hosts[addr].paused = True

    def resume(self, addr: str) -> None:
        """Deliver what arrived while addr was paused."""
        host = self.hosts[addr]
        host.paused = False
        held, host.held = host.held, []
        for arrive in held:
            arrive()

    def transport(self, node_id: str, addr: str) -> Callable[[Refused], "MemoryTransport"]:
        """The transport factory of the daemon node_id at addr (transport.api.TransportFactory)."""
        return lambda on_refused: MemoryTransport(self, node_id, addr, on_refused)

    # -- envelopes ---------------------------------------------------------------------------
    def send(self, src: MemoryTransport, addr: str, envelope: Envelope) -> None:
        """One envelope from src to addr, delivered after the link's delay (in link order)."""
        self.sent += 1
        loop = asyncio.get_running_loop()
        host = self.hosts.get(addr)
        if host is None:
            self.dropped += 1
            loop.call_later(self.refused_delay, src.refused, addr)
            return
        self._streams.setdefault(addr, {})[src.addr] = src
        delay = self.links.route(src.node_id, host.node_id)
        if delay is None:
            self.dropped += 1
            return
        link = (src.addr, addr)
        at = max(loop.time() + delay, self._last_arrival.get(link, 0.0) + 1e-9)  # timers of one time are unordered
        self._last_arrival[link] = at
        loop.call_at(at, self._arrive, host, addr, envelope)

    def _arrive(self, host: Host, addr: str, envelope: Envelope) -> None:
        if self.hosts.get(addr) is not host:
            self.dropped += 1
            return
        if host.paused:
            host.held.append(lambda: self._arrive(host, addr, envelope))
            return
        self.delivered += 1
        asyncio.get_running_loop().create_task(self._deliver(host, envelope), context=host.context)

    async def _deliver(self, host: Host, envelope: Envelope) -> None:
        try:
            envelope = checks.carried(envelope)
            checks.check(envelope)
        except errors.BadRequest as exc:  # what the server refuses; a core that sent it has a bug
            host.handler.note_malformed("Deliver")
            self.crashes.append(f"{host.node_id}: refused an envelope from {envelope.sender.node_id!r} "
                                f"as the wire would: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 (a message of the wrong shape: the wire's encoder raises at the sender)
            self.crashes.append(f"{host.node_id}: an envelope from {getattr(envelope.sender, 'node_id', None)!r} "
                                f"the wire could not carry: {type(exc).__name__}: {exc}")
            return
        try:
            await host.handler.deliver(envelope)
        except errors.BadRequest:
            pass  # refused and counted by the handler, as the server answers INVALID_ARGUMENT
        except Exception as exc:  # noqa: BLE001 (a handler bug: recorded for the simulation to report)
            self.crashes.append(f"{host.node_id}: Deliver raised {type(exc).__name__}: {exc}")

    # -- calls -------------------------------------------------------------------------------
    async def call(self, src: str, addr: str, method: str, request: Any, timeout: float) -> Any:
        """Call handler.method(request) on the daemon at addr (handler.method() when request is None,
        as the server calls status); PeerErrors as gRPC would give them."""
        return await self._call(src, addr, timeout,
                                lambda h: getattr(h, method)() if request is None else getattr(h, method)(request))

    async def stream(self, src: str, addr: str, method: str, request: Any, timeout: float) -> list[Any]:
        """A server-streaming call, its chunks collected (the simulated chunks are few)."""

        async def collect(handler: Any) -> list[Any]:
            return [checks.carried_chunk(chunk) async for chunk in getattr(handler, method)(request)]

        return await self._call(src, addr, timeout, collect)

    async def _call(self, src: str, addr: str, timeout: float, run: Callable[[Any], Awaitable[Any]]) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        host = self.hosts.get(addr)
        if host is None:
            await asyncio.sleep(self.refused_delay)
            raise errors.Unreachable(f"node {addr} refused the connection", refused=True)
        there = self.links.route(src, host.node_id)
        if there is None:
            await asyncio.sleep(timeout)
            raise errors.Unreachable(f"node {addr} did not answer in time")
        await asyncio.sleep(there)
        while host.paused and loop.time() < deadline and self.hosts.get(addr) is host:
            await asyncio.sleep(min(0.05, deadline - loop.time()))
        if self.hosts.get(addr) is not host or host.paused:
            raise errors.Unreachable(f"node {addr} did not answer in time")
        task = loop.create_task(run(host.handler), context=host.context)
        task.add_done_callback(_retrieve)  # its outcome may go unread (a lost answer, a caller gone)
        done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
        if not done:
            task.cancel()
            raise errors.Unreachable(f"node {addr} did not answer in time")
        if task.cancelled():
            raise errors.Unreachable(f"node {addr} closed the connection")
        back = self.links.route(host.node_id, src)
        if back is None:
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            raise errors.Unreachable(f"node {addr} did not answer in time")
        await asyncio.sleep(back)
        exc = task.exception()
        if exc is None:
            return task.result()
        if isinstance(exc, _SAME):
            raise type(exc)(str(exc))
        if isinstance(exc, errors.Unavailable):
            raise errors.Unreachable(f"node {addr} is unreachable")
        if isinstance(exc, errors.PeerError):
            raise errors.PeerError(f"node {addr} failed the call: UNKNOWN: {exc}")
        self.crashes.append(f"{host.node_id}: a call raised {type(exc).__name__}: {exc}")
        raise errors.PeerError(f"node {addr} failed the call: UNKNOWN: {exc}")


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


class MemoryTransport:
    """transport.api.Transport of one daemon on a MemoryNetwork."""

    def __init__(self, net: MemoryNetwork, node_id: str, addr: str, on_refused: Refused) -> None:
        self.net, self.node_id, self.addr = net, node_id, addr
        self._on_refused = on_refused
        self.closed = False

    def send(self, addr: str, envelope: Envelope) -> None:
        """Send through the network unless this daemon's transport is closed."""
        if not self.closed:
            self.net.send(self, addr, envelope)

    def refused(self, addr: str) -> None:
        """The network says addr refused one of our envelopes."""
        if not self.closed:
            self._on_refused(addr)

    def client(self, addr: str, timeout: float = 5.0, on_behalf_of: Vouch | None = None) -> MemoryClient:
        """A client for calls from this daemon to addr."""
        return MemoryClient(self.net, self.node_id, addr, timeout)

    async def close(self) -> None:
        """Send nothing more."""
        self.closed = True


class MemoryClient:
    """transport.api.PeerClient over a MemoryNetwork, with NodeClient's requests."""

    def __init__(self, net: MemoryNetwork, src: str, addr: str, timeout: float = 5.0) -> None:
        self.net, self.src, self.addr, self.timeout = net, src, addr, timeout

    async def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        return await self.net.call(self.src, self.addr, method, request, timeout or self.timeout)

    async def status(self) -> calls.StatusReply:
        """The node's status document."""
        return await self.net.call(self.src, self.addr, "status", None, self.timeout)

    async def kv_put(self, key: str, value: str, timeout: float | None = None) -> calls.KvPutReply:
        """Commit key=value through the node."""
        return await self._call("kv_put", calls.KvPutRequest(key=key, value=value), timeout)

    async def kv_get(self, key: str) -> calls.KvGetReply:
        """A linearizable read of key through the node."""
        return await self._call("kv_get", calls.KvGetRequest(key=key))

    async def join(self, node_id: str, addr: str, store_port: int = 0, ready: bool = True, uid: str = "",
                   boot: str = "", up: float = 0.0, site: str = "", near: Sequence[str] = (),
                   speed_class: int | None = None) -> calls.JoinReply:
        """Ask the node to admit node_id at addr."""
        request = calls.JoinRequest(node_id=node_id, addr=addr, store_port=store_port, ready=ready, uid=uid, boot=boot,
                                 up=up, site=site, near=tuple(near), speed_class=speed_class)
        return await self._call("join", request)

    async def force(self, voters: list[str]) -> calls.ForceReply:
        """The unsafe operator recovery."""
        return await self._call("force", calls.ForceRequest(voters=tuple(voters), confirm=True))

    async def group_failed(self, request: calls.GroupFailedRequest) -> calls.GroupFailedReply:
        """Report a failed group (forwarded to the leader)."""
        return await self._call("group_failed", request)

    async def report_checkpoint(self, node_id: str, step: int, digest: str, final: bool = False) -> calls.CheckpointReply:
        """Report a held checkpoint (forwarded to the leader)."""
        report = calls.CheckpointReport(node_id=node_id, step=step, digest=digest, final=final)
        return await self._call("report_checkpoint", report)

    async def leave(self, node_id: str = "", forwarded: bool = False) -> calls.LeaveReply:
        """Ask the node to leave, or (forwarded) commit node_id's leave on the leader."""
        return await self._call("leave", calls.LeaveRequest(node_id=node_id, forwarded=forwarded))

    async def fetch_entries(self, from_index: int, to_index: int, node_id: str,
                            timeout: float = 30.0) -> AsyncIterator[calls.EntryChunk]:
        """Committed entries [from_index, to_index] from the node."""
        request = calls.FetchEntriesRequest(node_id=node_id, from_index=from_index, to_index=to_index)
        for chunk in await self.net.stream(self.src, self.addr, "fetch_entries", request, timeout):
            yield chunk

    async def fetch_checkpoint(self, step: int, offset: int = 0,
                               timeout: float = 120.0) -> AsyncIterator[calls.CheckpointChunk]:
        """The node's checkpoint file of `step` from offset on."""
        request = calls.FetchCheckpointRequest(step=step, offset=offset)
        for chunk in await self.net.stream(self.src, self.addr, "fetch_checkpoint", request, timeout):
            yield chunk
