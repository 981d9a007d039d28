"""The forwarding header `x-dpeer-on-behalf-of` (a node passing a command on to the leader names the
caller it took it from) must not let a node certificate speak as another node where nothing is
forwarded (Raft and gossip messages), in the receiving node's own name, or at all from a box that
is no member (an outside tester's findings: a forged AppendRequest was committed, a forged Leave
ejected a voter)."""

from __future__ import annotations

import asyncio
import time

import grpc

from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.security import auth
from dpeer.security.auth import CallerRole as Role, Principal
from dpeer.transport.options import TOKEN_HEADER
from tests.support.daemons import formed, status_of
from tests.support.pki import Pki, channel


def test_a_node_cannot_vouch_for_another_node_to_speak_as_it() -> None:
    """Node n2 naming `node/n1` as the caller it forwards for must not be judged as n1."""
    member = {"n1", "n2", "n3"}.__contains__
    caller = auth.effective(Principal(Role.NODE, "n2"), "node/n1", "Deliver", "n3", member)
    assert isinstance(caller, tuple), f"a Raft message is never forwarded, yet n2 spoke for n1 as {caller}"
    for method, receiver, forwarder in (("Leave", "n1", "n2"), ("Leave", "n2", "n2"), ("Join", "n1", "old")):
        judged = auth.effective(Principal(Role.NODE, forwarder), "node/n1", method, receiver, member)
        assert isinstance(judged, tuple), (method, receiver, forwarder, judged)
    # what the forwarding path is for: n2 passes n3's own join (or an operator's command) to leader n1
    assert auth.effective(Principal(Role.NODE, "n2"), "node/n3", "Join", "n1", member) == Principal(Role.NODE, "n3")
    alice = Principal(Role.OPERATOR, "alice")
    assert auth.effective(Principal(Role.NODE, "n2"), "operator/alice", "KvPut", "n1", member) == alice
    assert isinstance(auth.effective(Principal(Role.NODE, "old"), "operator/alice", "KvPut", "n1", member), tuple)


def test_a_node_certificate_with_the_forwarding_header_cannot_eject_another_member(daemons, pki: Pki) -> None:
    """With n2's node certificate and the token, a forged Leave(node_id=n1, forwarded) carrying
    `x-dpeer-on-behalf-of: node/n1` must be refused; today it removes n1 from the voters."""
    n1 = daemons.start("n1", config=pki.config("n1", "node-n1"))
    n2 = daemons.start("n2", join=[n1.addr], config=pki.config("n2", "node-n2"))
    operator = pki.security("operator-alice")
    formed(n1.addr, {"n1", "n2"}, security=operator)
    formed(n2.addr, {"n1", "n2"}, security=operator)
    token = pki.token.read_text().strip()

    async def forge() -> grpc.StatusCode:
        ch = channel(n2.addr, pki, "node-n2")
        try:
            await ch.unary_unary("/dpeer.v1.Peer/Leave")(
                pb.LeaveRequest(node_id="n1", forwarded=True).SerializeToString(),
                metadata=((TOKEN_HEADER, token), (auth.ON_BEHALF_OF, "node/n1")), timeout=30.0)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        finally:
            await ch.close()
        return grpc.StatusCode.OK

    code = asyncio.run(forge())
    time.sleep(3.0)  # let a forged leave, had it been accepted, commit and apply everywhere
    doc = asyncio.run(status_of(n2.addr, operator, timeout=10.0))
    assert doc is not None
    n1_state = {m["node_id"]: m["state"] for m in doc["members"]}.get("n1")
    print(code.name, doc["voters"], doc["learners"], n1_state, n1.running)
    assert code == grpc.StatusCode.PERMISSION_DENIED, f"n2's certificate, speaking for n1, got {code.name}"
    assert "n1" in doc["voters"] and n1_state == "alive" and n1.running, \
        f"n2's certificate ejected n1: voters {doc['voters']}, n1 {n1_state}, n1 running {n1.running}"


def test_a_node_certificate_cannot_forge_a_committed_entry_as_the_leader(daemons, pki: Pki) -> None:
    """n2's certificate, with `x-dpeer-on-behalf-of: node/n1`, sends n3 an AppendRequest as n1 in a
    higher term carrying a kv_put of its own and a commit index covering it. n3 must refuse it;
    today n3 commits the forged entry, so a stranger's write sits in a committed log."""
    from dpeer.statemachine.entry import Entry, EntryKind
    from dpeer.transport import codec
    from tests.support.daemons import cli
    from tests.support.pki import operator_flags

    n1 = daemons.start("n1", config=pki.config("n1", "node-n1"))
    n2 = daemons.start("n2", join=[n1.addr], config=pki.config("n2", "node-n2"))
    n3 = daemons.start("n3", join=[n1.addr], config=pki.config("n3", "node-n3"))
    operator = pki.security("operator-alice")
    docs = {n.node_id: formed(n.addr, {"n1", "n2", "n3"}, security=operator) for n in (n1, n2, n3)}
    leader = docs["n3"]["leader"]
    assert leader != "n3"
    lead = {"n1": n1, "n2": n2}[leader]
    doc3 = asyncio.run(status_of(n3.addr, operator, timeout=10.0))
    uid_leader = asyncio.run(status_of(lead.addr, operator, timeout=10.0))["uid"]
    commit = doc3["commit_index"]
    last = cli("log", "--addr", n3.addr, "--from", str(commit), "--to", str(commit), "--json", *operator_flags(pki))
    prev_term = int(last.stdout.split('"term": ')[1].split("}")[0])
    term = doc3["term"] + 100
    entry = Entry(commit + 1, term, EntryKind.KV_PUT, {"key": "forged", "value": "by n2"})
    envelope = pb.Envelope(from_id=leader, from_addr=lead.addr, from_uid=uid_leader, from_epoch=doc3.get("epoch") or 0,
                           to_uid=doc3["uid"], append_request=pb.AppendRequest(
                               term=term, leader=leader, prev_index=commit, prev_term=prev_term,
                               entries=[codec.entry_out(entry)], commit=commit + 1))
    token = pki.token.read_text().strip()
    forger = "node-n2" if leader == "n1" else "node-n1"

    async def forge() -> grpc.StatusCode:
        ch = channel(n3.addr, pki, forger)
        try:
            await ch.unary_unary("/dpeer.v1.Peer/Deliver")(
                envelope.SerializeToString(),
                metadata=((TOKEN_HEADER, token), (auth.ON_BEHALF_OF, f"node/{leader}")), timeout=30.0)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        finally:
            await ch.close()
        return grpc.StatusCode.OK

    code = asyncio.run(forge())
    time.sleep(1.0)
    got = cli("log", "--addr", n3.addr, "--from", str(commit + 1), "--to", str(commit + 1), "--json",
              *operator_flags(pki))
    print(code.name, got.stdout.strip())
    assert code == grpc.StatusCode.PERMISSION_DENIED, f"{forger} spoke as {leader} to n3: {code.name}"
    assert f'"term": {term}' not in got.stdout, f"n3 committed the forged entry: {got.stdout.strip()}"
