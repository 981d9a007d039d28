"""Only a member's node certificate (or an operator's) reads the committed log and checkpoints
(issue 35's review): the log holds each view's secret, from which the rendezvous store's, the pair
proof's and the heal's keys derive, so a certificate made for a box never admitted, or a retired
box's, fetches neither (auth.member_only, checked by the Guard with the member check forwarding
uses). A member restarted after missing entries still catches up over mutual TLS."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from typing import AsyncIterator

import grpc

from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.security import auth
from dpeer.security.auth import CallerRole as Role, Principal
from dpeer.statemachine.entry import Entry, EntryKind
from dpeer.transport import calls
from dpeer.transport.client import NodeClient
from dpeer.transport.options import TOKEN_HEADER, Security
from dpeer.transport.server import serve
from tests.support.daemons import cli, formed, status_of, wait_status, wait_until
from tests.support.pki import Pki, channel, operator_flags

MEMBERS = {"n1", "n2"}


def test_only_members_nodes_and_operators_read_the_log() -> None:
    member = MEMBERS.__contains__
    for method in ("FetchEntries", "FetchCheckpoint"):
        assert auth.member_only(Principal(Role.NODE, "n2"), method, member) is None
        assert auth.member_only(Principal(Role.OPERATOR, "alice"), method, member) is None
        refused = auth.member_only(Principal(Role.NODE, "n3"), method, member)
        assert refused == (auth.Refusal.FORBIDDEN, f"{method} reads the cluster's log or checkpoints and node/n3 is "
                           "no member of this cluster (never admitted, or it left); start it with --join to join "
                           "first"), refused
    for method in ("Deliver", "Join", "Status"):  # a stranger's join is how it becomes a member
        assert auth.member_only(Principal(Role.NODE, "n3"), method, member) is None


class LogServer:
    """A PeerHandler serving one entry and one checkpoint chunk, whose members are MEMBERS."""

    def note_malformed(self, method: str) -> None:
        raise AssertionError(f"a well-formed {method} was taken for malformed")

    def node_id(self) -> str:
        return "n1"

    def may_forward(self, node_id: str) -> bool:
        return node_id in MEMBERS

    async def fetch_entries(self, request: calls.FetchEntriesRequest) -> AsyncIterator[calls.EntryChunk]:
        yield calls.EntryChunk(entries=(Entry(1, 1, EntryKind.KV_PUT, {"key": "k", "value": "secret"}),),
                               commit_index=1)

    async def fetch_checkpoint(self, request: calls.FetchCheckpointRequest) -> AsyncIterator[calls.CheckpointChunk]:
        yield calls.CheckpointChunk(step=request.step, data=b"model", total_size=5, done=True)


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def fetch(addr: str, pki: Pki, stem: str, method: str, request: object,
                forwarded_for: str | None = None) -> tuple[grpc.StatusCode, bytes]:
    """What a raw fetch of method with identity stem gets: its status and every byte streamed."""
    metadata = [(TOKEN_HEADER, pki.token.read_text().strip())]
    if forwarded_for is not None:
        metadata.append((auth.ON_BEHALF_OF, forwarded_for))
    ch = channel(addr, pki, stem)
    got = b""
    try:
        call = ch.unary_stream(f"/dpeer.v1.Peer/{method}")(request.SerializeToString(),  # type: ignore[attr-defined]
                                                          metadata=tuple(metadata), timeout=20)
        async for chunk in call:
            got += chunk
    except grpc.aio.AioRpcError as exc:
        return exc.code(), got
    finally:
        await ch.close()
    return grpc.StatusCode.OK, got


def test_the_guard_serves_the_log_and_checkpoints_to_members_and_operators_only(pki: Pki) -> None:
    async def go() -> None:
        addr = free_addr()
        server = await serve(addr, LogServer(), pki.security("node-n1"))
        entries = (("FetchEntries", pb.FetchEntriesRequest(node_id="n2", from_index=1)),
                   ("FetchCheckpoint", pb.FetchCheckpointRequest(step=7)))
        try:
            for method, request in entries:
                code, got = await fetch(addr, pki, "node-n2", method, request)
                assert code == grpc.StatusCode.OK and got, (method, code)
                code, got = await fetch(addr, pki, "operator-alice", method, request)
                assert code == grpc.StatusCode.OK and got, ("an operator reads the log", method, code)
                stranger = pb.FetchEntriesRequest(node_id="n3", from_index=1) if method == "FetchEntries" else request
                code, got = await fetch(addr, pki, "node-n3", method, stranger)
                assert (code, got) == (grpc.StatusCode.PERMISSION_DENIED, b""), (method, code, got)
                code, got = await fetch(addr, pki, "node-n3", method, stranger, forwarded_for="operator/alice")
                assert (code, got) == (grpc.StatusCode.PERMISSION_DENIED, b""), ("vouching for an operator", method)
            assert server.refusals[("FetchEntries", auth.Refusal.FORBIDDEN)] == 2
        finally:
            await server.stop(0.1)

    asyncio.run(go())


def test_a_certificate_of_no_member_does_not_read_the_views_secrets(daemons, pki: Pki) -> None:
    """The reviewer's reproduction: n3's certificate, made but never admitted, asks n1 for its log
    while n1 trains; the view's secret must not come back."""
    n1 = daemons.start("n1", config=pki.config("n1", "node-n1"), extra=["--job", "demo"])
    formed(n1.addr, {"n1"}, security=pki.security("client-bob"))
    views = n1.data_dir / "worker" / "views"
    view = wait_until(lambda: sorted(views.glob("view-*.json")) if views.is_dir() else [], 60, "a view")[-1]
    secret = json.loads(view.read_text())["secret"]
    assert secret
    request = pb.FetchEntriesRequest(node_id="n3", from_index=1)
    code, raw = asyncio.run(fetch(n1.addr, pki, "node-n3", "FetchEntries", request))
    assert secret.encode() not in raw, (f"a certificate of no member fetched the log ({code.name}, {len(raw)} "
                                        "bytes) and in it the secret of the view the group forms from")
    assert code == grpc.StatusCode.PERMISSION_DENIED
    code, raw = asyncio.run(fetch(n1.addr, pki, "operator-alice", "FetchEntries",
                                  pb.FetchEntriesRequest(from_index=1)))
    assert code == grpc.StatusCode.OK and secret.encode() in raw, "the operator reads the log as before"


async def puts(addr: str, security: Security, count: int) -> None:
    async with NodeClient(addr, security=security, timeout=20) as client:
        for i in range(count):
            assert (await client.kv_put(f"k{i}", str(i))).committed


def committed(doc: dict, node_id: str) -> str | None:
    """The committed status of node_id's member record in a status document."""
    return next((m["committed"] for m in doc["members"] if m["node_id"] == node_id), None)


def test_a_restarted_member_catches_up_and_a_retired_box_reads_no_more(daemons, pki: Pki) -> None:
    operator = pki.security("operator-alice")
    n1 = daemons.start("n1", config=pki.config("n1", "node-n1"))
    n2 = daemons.start("n2", join=[n1.addr], config=pki.config("n2", "node-n2"))
    n3 = daemons.start("n3", join=[n1.addr], config=pki.config("n3", "node-n3"))
    formed(n1.addr, {"n1", "n2", "n3"}, security=operator)
    daemons.signal(n3, signal.SIGKILL)
    n3.proc.wait(timeout=30)
    asyncio.run(puts(n1.addr, operator, 40))
    commit = asyncio.run(status_of(n1.addr, operator, timeout=10.0))["commit_index"]  # type: ignore[index]
    n3 = daemons.start("n3", listen=n3.addr, config=pki.config("n3", "node-n3"))
    wait_status(n3.addr, lambda d: d["last_applied"] >= commit, "n3 caught up after its restart", security=operator)
    for node in (n1, n2):
        assert "refused a call to FetchEntries" not in node.log_path.read_text(), f"{node.node_id} refused a member"
    request = pb.FetchEntriesRequest(node_id="n3", from_index=1)
    code, raw = asyncio.run(fetch(n2.addr, pki, "node-n3", "FetchEntries", request))
    assert code == grpc.StatusCode.OK and b"k39" in raw, f"member n3 could not read n2's log: {code.name}"

    left = cli("leave", "--addr", n3.addr, *operator_flags(pki))
    assert left.returncode == 0, left.stderr
    wait_status(n2.addr, lambda d: "n3" not in d["voters"] + d["learners"] and committed(d, "n3") == "left",
                "n3's leave applied on n2", security=operator)
    code, raw = asyncio.run(fetch(n2.addr, pki, "node-n3", "FetchEntries", request))
    assert (code, raw) == (grpc.StatusCode.PERMISSION_DENIED, b""), f"a retired box read the log: {code.name}"
