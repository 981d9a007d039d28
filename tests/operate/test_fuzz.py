"""Hostile and broken input against a running node's gRPC port: it must stay up and unchanged.

Seeded (DPEER_FUZZ_SEED to replay; the seed is printed) and bounded. After every batch the node
answers, its term, commit index, applied index, leader, committed members and group are what they
were, and every Deliver it refused as malformed is counted in `invalid_messages` and logged.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from typing import Any, Callable

import grpc
import pytest

from dpeer.transport.options import MAX_MESSAGE_BYTES
from dpeer.proto.v1 import dpeer_pb2 as pb
from tests.support.daemons import cli, formed, status_of

U64 = 2**64 - 1
METHODS_SAFE = ["Deliver", "Status", "KvGet", "KvList"]  # random bodies cannot change state through these
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def stable_view(doc: dict[str, Any]) -> dict[str, Any]:
    """What hostile input must not change (incarnations and counters may move)."""
    return {
        "term": doc["term"], "commit_index": doc["commit_index"], "last_applied": doc["last_applied"],
        "leader": doc["leader"], "role": doc["role"], "group": doc["group"],
        "committed": sorted((m["node_id"], m["addr"], m["committed"]) for m in doc["members"] if m.get("committed")),
        "self_alive": any(m["node_id"] == doc["node_id"] and m["state"] == "alive" for m in doc["members"]),
        "voters": doc.get("voters"),
    }


def hb(node_id: str = "evil", addr: str = "127.0.0.1:1", **kw: int) -> pb.Heartbeat:
    return pb.Heartbeat(node_id=node_id, addr=addr, **kw)


def hostile_envelopes(target: str, target_addr: str, rng: random.Random) -> list[tuple[str, pb.Envelope]]:
    """Well-formed Envelopes with absurd or forged contents, each named."""
    many_updates = [pb.MemberUpdate(state=pb.DEAD, node_id=f"x{i}", addr="127.0.0.1:1", incarnation=i, origin="evil")
                    for i in range(10_000)]
    bad_entries = [pb.Entry(index=1, term=1, kind="no-such-kind", payload=b"\x00garbage"),
                   pb.Entry(index=1, term=1, kind="kv_put", payload=rng.randbytes(64))]
    out: list[tuple[str, pb.Envelope]] = [
        ("empty envelope", pb.Envelope()),
        ("no body", pb.Envelope(from_id="evil", from_addr="127.0.0.1:1")),
        ("empty from_id", pb.Envelope(ping=pb.Ping(seq=1, target=target, hb=hb()))),
        ("huge from_id", pb.Envelope(from_id="e" * 5000, ping=pb.Ping(seq=1, target=target, hb=hb()))),
        ("ping without hb", pb.Envelope(from_id="evil", ping=pb.Ping(seq=1, target=target))),
        ("heartbeat of another node", pb.Envelope(from_id="evil", ping=pb.Ping(seq=1, target=target, hb=hb(target, target_addr)))),
        ("ping with u64 incarnation", pb.Envelope(from_id="evil", ping=pb.Ping(seq=U64, target=target, hb=hb(incarnation=U64, term=U64)))),
        ("ping with bad addr", pb.Envelope(from_id="evil", ping=pb.Ping(seq=1, target=target, hb=hb(addr="no port")))),
        ("ping with nan time", pb.Envelope(from_id="evil", ping=pb.Ping(seq=1, target=target, hb=hb(sent_at=float("nan"))))),  # type: ignore[arg-type]
        ("10k piggybacked updates", pb.Envelope(from_id="evil", gossip=pb.Gossip(hb=hb(), updates=many_updates))),
        ("update with unknown state", pb.Envelope(from_id="evil", gossip=pb.Gossip(hb=hb(), updates=[
            pb.MemberUpdate(state=7, node_id=target, addr=target_addr, incarnation=1, origin="evil")]))),
        ("target declared dead at u64 incarnation", pb.Envelope(from_id="evil", gossip=pb.Gossip(hb=hb(), updates=[
            pb.MemberUpdate(state=pb.DEAD, node_id=target, addr=target_addr, incarnation=U64, origin="evil")]))),
        ("target declared left", pb.Envelope(from_id="evil", gossip=pb.Gossip(hb=hb(), updates=[
            pb.MemberUpdate(state=pb.LEFT, node_id=target, addr=target_addr, incarnation=3, origin="evil")]))),
        ("push-pull with 20k records", pb.Envelope(from_id="evil", push_pull=pb.PushPull(hb=hb(), members=[
            pb.MemberRecord(node_id=f"r{i}", addr="127.0.0.1:1", state=pb.ALIVE) for i in range(20_000)]))),
        ("push-pull claiming the target at u64", pb.Envelope(from_id="evil", push_pull=pb.PushPull(hb=hb(), members=[
            pb.MemberRecord(node_id=target, addr="10.9.9.9:9", state=pb.DEAD, incarnation=U64, term=U64)]))),
        ("vote request at term 0", pb.Envelope(from_id="evil", vote_request=pb.VoteRequest(term=0, candidate="evil"))),
        ("append with unknown entry kind", pb.Envelope(from_id="evil", append_request=pb.AppendRequest(
            term=1, leader="evil", prev_index=0, prev_term=0, entries=bad_entries[:1]))),
        ("append with garbage payload", pb.Envelope(from_id="evil", append_request=pb.AppendRequest(
            term=1, leader="evil", prev_index=0, prev_term=0, entries=bad_entries[1:]))),
        ("append with non-contiguous entries", pb.Envelope(from_id="evil", append_request=pb.AppendRequest(
            term=5, leader="evil", prev_index=0, prev_term=0, entries=[
                pb.Entry(index=7, term=1, kind="kv_put", payload=b"\x80")]))),
    ]
    return out


def stranger_raft(target: str, target_addr: str) -> dict[str, pb.Envelope]:
    """Well-formed Raft messages with absurd terms from a node that is not a member (or posing as the target)."""
    return {
        "vote request at u64 term": pb.Envelope(from_id="evil", from_addr="127.0.0.1:1", vote_request=pb.VoteRequest(
            term=U64, candidate="evil", last_index=U64, last_term=U64)),
        "pre-vote at u64 term": pb.Envelope(from_id="evil", from_addr="127.0.0.1:1", vote_request=pb.VoteRequest(
            term=U64, candidate="evil", last_index=U64, last_term=U64, pre_vote=True)),
        "vote response forged": pb.Envelope(from_id="evil", vote_response=pb.VoteResponse(term=U64, granted=True)),
        "append from a forged leader": pb.Envelope(from_id="evil", from_addr="127.0.0.1:1", append_request=pb.AppendRequest(
            term=U64, leader="evil", prev_index=0, prev_term=0, commit=U64)),
        "append response forged": pb.Envelope(from_id="evil", append_response=pb.AppendResponse(
            term=1, success=True, match_index=U64)),
        "raft heartbeat at u64": pb.Envelope(from_id="evil", raft_heartbeat=pb.RaftHeartbeat(term=U64, leader="evil", commit=U64)),
        "raft heartbeat response": pb.Envelope(from_id="evil", raft_heartbeat_response=pb.RaftHeartbeatResponse(term=U64, read_seq=U64)),
        "snapshot from a forged leader": pb.Envelope(from_id="evil", snapshot_request=pb.SnapshotRequest(
            term=U64, leader="evil", index=U64, term_of_index=U64, data=bytes(range(256)) * 4, voters=["evil"])),
        "forged from the target itself": pb.Envelope(from_id=target, from_addr=target_addr, raft_heartbeat=pb.RaftHeartbeat(
            term=U64, leader=target, commit=U64)),
    }


def assert_unchanged(addr: str, before: dict[str, Any], what: str) -> dict[str, Any]:
    doc = asyncio.run(status_of(addr, timeout=10.0))
    assert doc is not None, f"the node stopped answering after {what}"
    assert stable_view(doc) == stable_view(before), f"{what} changed the node's state"
    return doc


def test_hostile_input_leaves_the_node_up_and_unchanged(daemons) -> None:
    seed = int(os.environ.get("DPEER_FUZZ_SEED", time.time_ns() % 1_000_000))
    print(f"fuzz seed {seed} (DPEER_FUZZ_SEED={seed} replays it)")
    rng = random.Random(seed)
    node = daemons.start("n1")
    before = formed(node.addr, {"n1"})
    host, port = node.addr.rsplit(":", 1)

    # 1. Random bytes over raw TCP, some after a valid HTTP/2 preface.
    for i in range(150):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            junk = rng.randbytes(rng.randrange(0, 4096))
            sock.sendall((HTTP2_PREFACE if i % 3 == 0 else b"") + junk)
            if i % 10 == 0:
                sock.settimeout(0.5)
                try:
                    sock.recv(1024)
                except OSError:
                    pass
    assert node.running, node.tail()
    assert_unchanged(node.addr, before, "random TCP bytes")

    async def grpc_batches() -> dict[str, Any]:
        options = [("grpc.max_send_message_length", 64 * 1024 * 1024), ("grpc.max_receive_message_length", -1)]
        counts: dict[str, Any] = {"deliver_invalid": 0, "codes": {}}
        async with grpc.aio.insecure_channel(node.addr, options=options) as channel:
            def raw(method: str) -> Callable:
                return channel.unary_unary(f"/dpeer.v1.Peer/{method}")

            async def call(method: str, body: bytes, label: str) -> grpc.StatusCode:
                try:
                    await raw(method)(body, timeout=10)
                    code = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as exc:
                    code = exc.code()
                    assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE,
                                        grpc.StatusCode.DEADLINE_EXCEEDED), (label, code, exc.details())
                if method == "Deliver" and code == grpc.StatusCode.INVALID_ARGUMENT:
                    counts["deliver_invalid"] += 1
                counts["codes"].setdefault(label, []).append(code.name)
                return code

            # 2. Garbage and truncated protobuf bodies on methods whose bodies cannot change state.
            valid = pb.Envelope(from_id="n9", from_addr="127.0.0.1:1",
                                ping=pb.Ping(seq=3, target="n1", hb=hb("n9"))).SerializeToString()
            for _ in range(300):
                method = rng.choice(METHODS_SAFE)
                kind = rng.randrange(3)
                if kind == 0:
                    body = rng.randbytes(rng.randrange(1, 512))
                elif kind == 1:
                    body = valid[: rng.randrange(1, len(valid))]
                else:
                    mutated = bytearray(valid)
                    for _ in range(rng.randrange(1, 6)):
                        mutated[rng.randrange(len(mutated))] = rng.randrange(256)
                    body = bytes(mutated)
                await call(method, body, f"garbage {method}")
            # FetchEntries: garbage bodies, then index extremes.
            fetch = channel.unary_stream("/dpeer.v1.Peer/FetchEntries")
            for _ in range(30):
                try:
                    async for _chunk in fetch(rng.randbytes(rng.randrange(1, 64)), timeout=10):
                        pass
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE), exc
            for lo, hi, expect in ((0, 0, grpc.StatusCode.INVALID_ARGUMENT), (U64, 0, grpc.StatusCode.OK),
                                   (U64, U64, grpc.StatusCode.OK), (5, 2, grpc.StatusCode.OK)):
                request = pb.FetchEntriesRequest(node_id="evil", from_index=lo, to_index=hi).SerializeToString()
                got = grpc.StatusCode.OK
                try:
                    chunks = [c async for c in fetch(request, timeout=10)]
                    assert all(not c or True for c in chunks)
                except grpc.aio.AioRpcError as exc:
                    got = exc.code()
                assert got == expect, (lo, hi, got)

            # 3. Oversized messages are refused by size, not read into memory without bound.
            big = pb.Envelope(from_id="evil", snapshot_request=pb.SnapshotRequest(
                term=1, leader="evil", data=b"\0" * (MAX_MESSAGE_BYTES + 1024))).SerializeToString()
            assert await call("Deliver", big, "oversized") == grpc.StatusCode.RESOURCE_EXHAUSTED
            counts["deliver_invalid_after_oversize"] = counts["deliver_invalid"]
            # KvPut/KvGet/KvDelete/KvList with absurd keys: refused before reaching the log.
            for key, value in (("k" * 100_000, "v"), ("", "v"), ("k", "v" * (1 << 20))):
                body = pb.KvPutRequest(key=key, value=value).SerializeToString()
                assert await call("KvPut", body, "absurd kv_put") == grpc.StatusCode.INVALID_ARGUMENT, len(key)
            body = pb.KvGetRequest(key="k" * 100_000).SerializeToString()
            assert await call("KvGet", body, "absurd kv_get") == grpc.StatusCode.INVALID_ARGUMENT
            for key in ("k" * 100_000, ""):
                body = pb.KvDeleteRequest(key=key).SerializeToString()
                assert await call("KvDelete", body, "absurd kv_delete") == grpc.StatusCode.INVALID_ARGUMENT
            body = pb.KvListRequest(prefix="k" * 100_000).SerializeToString()
            assert await call("KvList", body, "absurd kv_list") == grpc.StatusCode.INVALID_ARGUMENT
            # ReportCheckpoint with a bad digest, step or node id, or from a stranger: refused.
            good = "ab" * 32
            for label, report in (("bad digest", pb.CheckpointReport(node_id="n1", step=5, digest="XY" * 32)),
                                  ("short digest", pb.CheckpointReport(node_id="n1", step=5, digest="ab")),
                                  ("step 0", pb.CheckpointReport(node_id="n1", step=0, digest=good)),
                                  ("u64 step", pb.CheckpointReport(node_id="n1", step=U64, digest=good)),
                                  ("empty node", pb.CheckpointReport(node_id="", step=5, digest=good)),
                                  ("stranger", pb.CheckpointReport(node_id="evil", step=5, digest=good))):
                code = await call("ReportCheckpoint", report.SerializeToString(), f"checkpoint {label}")
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (label, code)
            counts["invalid_before_hostile"] = counts["deliver_invalid"]

            # 4. Well-formed Envelopes with absurd values, forged ids and oversize lists.
            for label, envelope in hostile_envelopes("n1", node.addr, rng):
                await call("Deliver", envelope.SerializeToString(), label)
        return counts

    counts = asyncio.run(grpc_batches())
    print({k: sorted(set(v)) for k, v in counts["codes"].items()})
    assert node.running, node.tail()
    after = assert_unchanged(node.addr, before, "gRPC garbage and hostile envelopes")
    # Every Deliver refused as malformed was counted...
    assert after["invalid_messages"] - before["invalid_messages"] == counts["deliver_invalid"], counts
    hostile_codes = {label: counts["codes"][label][0] for label, _ in hostile_envelopes("n1", node.addr, rng)}
    for label in ("empty envelope", "no body", "empty from_id", "huge from_id", "heartbeat of another node",
                  "ping with bad addr", "10k piggybacked updates", "update with unknown state",
                  "push-pull with 20k records", "vote request at term 0", "append with unknown entry kind",
                  "append with non-contiguous entries"):
        assert hostile_codes[label] == "INVALID_ARGUMENT", (label, hostile_codes[label])
    # ...and logged as a JSON line naming the sender.
    refusals = [r for r in node.log_lines() if r.get("msg", "").startswith("refused a")]
    assert refusals, "no refusal was logged"
    assert any("undecodable" in r["msg"] for r in refusals), "undecodable requests were not logged"
    not_json = [line for line in node.log_path.read_text(errors="replace").splitlines()
                if line.strip() and not line.startswith("{")]
    assert not not_json, f"log lines that are not JSON objects: {not_json[:5]}"

    # The node still does its job: a write commits and reads back.
    assert cli("kv", "put", "after-fuzz", "ok", "--addr", node.addr).returncode == 0
    got = cli("kv", "get", "after-fuzz", "--addr", node.addr)
    assert got.returncode == 0 and got.stdout.strip() == "ok"
    # and can still elect: the term it holds leaves room to grow.
    final = asyncio.run(status_of(node.addr))
    assert final is not None and final["term"] < 2**62, final["term"]


@pytest.mark.parametrize("label", sorted(stranger_raft("n1", "127.0.0.1:1")))
def test_raft_message_from_a_stranger_changes_nothing(daemons, label: str) -> None:
    """A non-member cannot move a member's term, leader or log with one forged message."""
    node = daemons.start("n1")
    before = formed(node.addr, {"n1"})
    envelope = stranger_raft("n1", node.addr)[label]

    async def send() -> None:
        async with grpc.aio.insecure_channel(node.addr) as channel:
            try:
                await channel.unary_unary("/dpeer.v1.Peer/Deliver")(envelope.SerializeToString(), timeout=10)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
    asyncio.run(send())
    # Deliver steps the message before it answers; give the node's loop a moment to act on it.
    time.sleep(1.0)
    assert node.running, node.tail()
    assert_unchanged(node.addr, before, label)
    assert cli("kv", "put", "still", "works", "--addr", node.addr, "--timeout", "10").returncode == 0
