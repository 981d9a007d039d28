"""A secured cluster tried as an outsider would, with nothing but grpcio: every RPC in proto/, without
credentials, with a certificate from another CA, and with a valid certificate speaking for another
node or lacking the role, is refused; members, voters, term, commit index, kv and checkpoint stay
as they were; and 1,000 random, well-formed but absurd calls leave the node up and its log quiet."""

from __future__ import annotations

import asyncio
import json
import os
import random
import ssl
import time
import urllib.request
from typing import Any

import grpc

from dpeer.transport.options import TOKEN_HEADER
from dpeer.security import auth
from dpeer.proto.v1 import dpeer_pb2 as pb
from tests.support.daemons import cli, formed, status_of, wait_until
from tests.support.pki import Pki, channel, operator_flags

U64 = 2**64 - 1
DIGEST = "ab" * 32
SERVICE = pb.DESCRIPTOR.services_by_name["Peer"]
REFUSED_AT_HANDSHAKE = (grpc.StatusCode.UNAVAILABLE,)
REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def forged(victim: str, addr: str) -> dict[str, Any]:
    """One request per method that, from anyone but an operator or `victim` itself, must change nothing."""
    envelope = pb.Envelope(from_id=victim, from_addr="127.0.0.1:9", vote_request=pb.VoteRequest(
        term=U64 // 2, candidate=victim, last_index=U64 // 2, last_term=U64 // 2))
    return {
        "Deliver": envelope, "Stream": pb.EnvelopeBatch(envelopes=[envelope]),
        "FetchEntries": pb.FetchEntriesRequest(node_id=victim, from_index=1),
        "Join": pb.JoinRequest(node_id=victim, addr="127.0.0.1:9", store_port=9, ready=True),
        "Leave": pb.LeaveRequest(node_id=victim, forwarded=True),
        "GroupFailed": pb.GroupFailedRequest(node_id=victim, generation=1, reason="forged"),
        "Force": pb.ForceRequest(voters=[victim], confirm=True),
        "ReportCheckpoint": pb.CheckpointReport(node_id=victim, step=5, digest=DIGEST),
        "Status": pb.StatusRequest(), "KvPut": pb.KvPutRequest(key="evil", value="1"),
        "KvGet": pb.KvGetRequest(key="canary"), "JobControl": pb.JobControlRequest(action="retry"),
        "KvDelete": pb.KvDeleteRequest(key="canary"), "KvList": pb.KvListRequest(prefix="can"),
        "FetchCheckpoint": pb.FetchCheckpointRequest(step=5),
    }


async def call(ch: grpc.aio.Channel, method: str, request: Any, token: str | None, timeout: float = 10.0) -> grpc.StatusCode:
    """Make one call as raw bytes; the status code it ended with."""
    m = SERVICE.methods_by_name[method]
    path, body = f"/dpeer.v1.Peer/{method}", request.SerializeToString()
    metadata = ((TOKEN_HEADER, token),) if token else ()
    try:
        if m.client_streaming:
            stream = ch.stream_unary(path)(metadata=metadata, timeout=timeout)
            try:
                await stream.write(body)
                await stream.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                pass  # the node may refuse before it reads: the call's status says how
            await stream
        elif m.server_streaming:
            async for _ in ch.unary_stream(path)(body, metadata=metadata, timeout=timeout):
                pass
        else:
            await ch.unary_unary(path)(body, metadata=metadata, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def state(addr: str, pki: Pki) -> dict[str, Any]:
    """What no refused call may change: members, voters, term, commit index, checkpoint, and the kv."""
    doc = asyncio.run(status_of(addr, pki.security("operator-alice"), timeout=10.0))
    assert doc is not None, f"{addr} stopped answering"
    kv = [cli("kv", "get", key, "--addr", addr, "--json", *operator_flags(pki)) for key in ("canary", "evil")]
    return {"members": sorted((m["node_id"], m["addr"], m["committed"]) for m in doc["members"]),
            "voters": doc["voters"], "learners": doc["learners"], "term": doc["term"],
            "commit_index": doc["commit_index"], "leader": doc["leader"], "checkpoint": doc["checkpoint"],
            "kv": [json.loads(r.stdout) if r.stdout else r.stderr for r in kv]}


def test_every_rpc_refuses_strangers_forgers_and_non_operators(daemons, pki: Pki) -> None:
    n1 = daemons.start("n1", config=pki.config("n1", "node-n1"))
    n2 = daemons.start("n2", join=[n1.addr], config=pki.config("n2", "node-n2"))
    operator = pki.security("operator-alice")
    formed(n1.addr, {"n1", "n2"}, security=operator)
    formed(n2.addr, {"n1", "n2"}, security=operator)
    put = cli("kv", "put", "canary", "yes", "--addr", n2.addr, *operator_flags(pki))
    assert put.returncode == 0, put.stderr  # through a follower: forwarded to the leader as alice's
    token = pki.token.read_text().strip()
    before = {n.node_id: state(n.addr, pki) for n in (n1, n2)}
    assert before["n1"]["kv"][0]["found"] and not before["n1"]["kv"][1]["found"]

    async def attack() -> dict[str, dict[str, str]]:
        seen: dict[str, dict[str, str]] = {}
        chans = {"plaintext": channel(n1.addr, pki, None, tls=False), "no certificate": channel(n1.addr, pki, None),
                 "another CA": channel(n1.addr, pki, "node-n1", other_ca=True),
                 "n2 without token": channel(n1.addr, pki, "node-n2"), "n2 as n1": channel(n1.addr, pki, "node-n2"),
                 "client bob": channel(n1.addr, pki, "client-bob")}
        try:
            for method in SERVICE.methods_by_name:
                requests = forged("n1", n1.addr)
                # zero bytes (a valid empty request) and the forged request, from each stranger
                for label in ("plaintext", "no certificate", "another CA"):
                    for request in (type(requests[method])(), requests[method]):
                        code = await call(chans[label], method, request, token)
                        assert code in REFUSED_AT_HANDSHAKE, (method, label, code)
                        seen.setdefault(method, {})[label] = code.name
                code = await call(chans["n2 without token"], method, requests[method], None)
                assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code)
                seen[method]["n2 without token"] = code.name
                # reads: any certificate of the cluster may make them; a node may fetch a checkpoint
                if method not in ("Status", "KvGet", "KvList", "FetchCheckpoint"):
                    code = await call(chans["n2 as n1"], method, requests[method], token)
                    assert code == grpc.StatusCode.PERMISSION_DENIED, (method, code)
                    seen[method]["n2 as n1 / n2 as operator"] = code.name
                if method in ("KvPut", "KvDelete", "Force", "Leave", "JobControl", "FetchCheckpoint", "FetchEntries",
                              "Join", "Deliver", "Stream", "ReportCheckpoint", "GroupFailed"):
                    request = pb.LeaveRequest() if method == "Leave" else requests[method]  # "leave yourself"
                    code = await call(chans["client bob"], method, request, token)
                    assert code == grpc.StatusCode.PERMISSION_DENIED, (method, code)
                    seen[method]["read-only client"] = code.name
            # n2 speaking as itself may leave only itself: asking n1 to leave is refused too
            assert await call(chans["n2 as n1"], "Leave", pb.LeaveRequest(), token) == grpc.StatusCode.PERMISSION_DENIED
        finally:
            for ch in chans.values():
                await ch.close()
        return seen

    seen = asyncio.run(attack())
    print(json.dumps(seen, indent=1, sort_keys=True))
    assert set(seen) == set(SERVICE.methods_by_name), "every RPC was tried"
    time.sleep(1.0)  # a Deliver that slipped through would have been stepped by now
    assert n1.running and n2.running, n1.tail()
    after = {n.node_id: state(n.addr, pki) for n in (n1, n2)}
    assert after == before, "a refused call changed a node's state"

    # refusals are counted in status and metrics, and logged (quietly) as JSON lines
    doc = asyncio.run(status_of(n1.addr, operator))
    assert doc is not None and doc["security"]["mode"] == "mtls+token" and not doc["security"]["insecure"]
    assert doc["security"]["refused"] >= 2 * len(SERVICE.methods_by_name), doc["security"]
    lines = [r for r in n1.log_lines() if r.get("msg", "").startswith("refused a call")]
    assert any("may not speak for 'n1'" in r["msg"] for r in lines), lines[:5]
    assert any("operator command" in r["msg"] for r in lines), lines[:5]


def random_request(method: str, rng: random.Random) -> Any:
    """A well-formed request of `method` with absurd values: u64 extremes, and node ids that are never
    the caller's own (the stranger node holds n2's certificate)."""
    who = rng.choice(["n1", "n3", "evil", "", "x" * 300, "\u202e", "n1\x00"])
    big = rng.choice([0, 1, U64, U64 // 2, rng.randrange(U64)])
    envelope = pb.Envelope(from_id=who, from_addr=rng.choice(["", "127.0.0.1:1", "nonsense"]), **rng.choice([
        {"vote_request": pb.VoteRequest(term=big, candidate=who, last_index=big, last_term=big)},
        {"append_request": pb.AppendRequest(term=big, leader=who, commit=big,
                                            entries=[pb.Entry(index=big, term=big, kind="kv_put", payload=rng.randbytes(8))])},
        {"gossip": pb.Gossip(hb=pb.Heartbeat(node_id=who, incarnation=big), updates=[
            pb.MemberUpdate(state=pb.DEAD, node_id="n1", incarnation=big, origin=who)])},
        {"raft_heartbeat": pb.RaftHeartbeat(term=big, leader=who, commit=big)},
    ]))
    return {
        "Deliver": envelope, "Stream": pb.EnvelopeBatch(envelopes=[envelope] * rng.randrange(1, 4)),
        "FetchEntries": pb.FetchEntriesRequest(node_id=who, from_index=big, to_index=big),
        "Join": pb.JoinRequest(node_id=who, addr="127.0.0.1:1", store_port=rng.randrange(1 << 32)),
        "Leave": pb.LeaveRequest(node_id=who, forwarded=rng.random() < 0.5),
        "GroupFailed": pb.GroupFailedRequest(node_id=who, generation=big, reason="x" * rng.randrange(5000)),
        "Force": pb.ForceRequest(voters=[who] * rng.randrange(20), confirm=True),
        "ReportCheckpoint": pb.CheckpointReport(node_id=who, step=big, digest=rng.choice([DIGEST, "zz"])),
        "Status": pb.StatusRequest(), "KvPut": pb.KvPutRequest(key=who or "k", value="v" * rng.randrange(100)),
        "KvGet": pb.KvGetRequest(key=who), "JobControl": pb.JobControlRequest(action=rng.choice(["retry", "boom", ""])),
        "KvDelete": pb.KvDeleteRequest(key=who or "canary"), "KvList": pb.KvListRequest(prefix=who),
        "FetchCheckpoint": pb.FetchCheckpointRequest(step=big, offset=big),
    }[method]


def test_a_thousand_absurd_calls_leave_the_node_up_unchanged_and_its_log_quiet(daemons, pki: Pki) -> None:
    seed = int(os.environ.get("DPEER_FUZZ_SEED", time.time_ns() % 1_000_000))
    print(f"fuzz seed {seed} (DPEER_FUZZ_SEED={seed} replays it)")
    rng = random.Random(seed)
    metrics = f"127.0.0.1:{daemons.port()}"
    n1 = daemons.start("n1", config=pki.config("n1", "node-n1"), extra=["--metrics-listen", metrics])
    operator = pki.security("operator-alice")
    formed(n1.addr, {"n1"}, security=operator)
    before = state(n1.addr, pki)
    token = pki.token.read_text().strip()

    async def fuzz() -> dict[str, int]:
        # strangers (no TLS, no certificate, another CA), a member's certificate without the token,
        # a read-only client, and n2's certificate (not a member) speaking for others
        kinds = {"plaintext": (channel(n1.addr, pki, None, tls=False), token),
                 "no certificate": (channel(n1.addr, pki, None), token),
                 "another CA": (channel(n1.addr, pki, "node-n1", other_ca=True), token),
                 "tokenless": (channel(n1.addr, pki, "node-n3"), None),
                 "client": (channel(n1.addr, pki, "client-bob"), token),
                 "stranger node": (channel(n1.addr, pki, "node-n2"), token)}
        codes: dict[str, int] = {}
        try:
            for _ in range(1000):
                label = rng.choice(sorted(kinds))
                method = rng.choice(sorted(SERVICE.methods_by_name))
                request = random_request(method, rng)
                code = await call(kinds[label][0], method, request, kinds[label][1], timeout=15.0)
                if code == grpc.StatusCode.OK:
                    assert method in ("Status", "KvGet", "KvList"), (label, method, request)
                assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED), (label, method)
                codes[code.name] = codes.get(code.name, 0) + 1
        finally:
            for ch, _ in kinds.values():
                await ch.close()
        return codes

    codes = asyncio.run(fuzz())
    print(codes)
    assert n1.running, n1.tail()
    assert state(n1.addr, pki) == before, "absurd calls changed the node's state"
    lines = [r for r in n1.log_lines() if r.get("msg", "").startswith("refused a call")]
    # once per peer (here one address), method and reason per interval, whatever the number of refusals
    assert 0 < len(lines) <= 2 * len(SERVICE.methods_by_name) * len(auth.Refusal), len(lines)
    doc = wait_until(lambda: asyncio.run(status_of(n1.addr, operator)), 10, "a status")
    assert doc["security"]["refused"] > len(lines), (doc["security"], len(lines))

    tls = ssl.create_default_context(cafile=str(pki.ca))  # a secured node serves /metrics over TLS
    tls.check_hostname = False  # node certificates name "dpeer", not 127.0.0.1; the CA is still checked
    tls.load_cert_chain(*map(str, pki.files("operator-alice")))

    def counted() -> float:
        text = urllib.request.urlopen(f"https://{metrics}/metrics", timeout=5, context=tls).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("dpeer_refused_requests_total{"))
    # the metric catches up with the status within a metrics period (0.5 s)
    wait_until(lambda: counted() >= doc["security"]["refused"], 10, "the refusal metric")
