"""Operator rights come only from an operator's key (issue 35, finding 3): on a real mTLS cluster a
node certificate with the forwarding header `x-dpeer-on-behalf-of: operator/NAME` commits
nothing; an operator's command forwarded by a follower carries the operator's proof and commits;
a proof is taken once; a node that joins through a follower proves its own join."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import yaml

from dpeer.proto.v1 import dpeer_pb2 as pb
from dpeer.security import auth, certs, proof
from dpeer.transport.options import TOKEN_HEADER
from tests.support.daemons import cli, formed, one_sentence
from tests.support.pki import Pki, channel, operator_flags


def trusting_both_cas(pki: Pki, name: str) -> Path:
    """node `name`'s config with a tls_ca bundle of the cluster's CA and the stranger's (a CA
    rotation half done): it lets the stranger's operator in, the leader does not."""
    path = pki.config(name, f"node-{name}")
    doc = yaml.safe_load(path.read_text())
    bundle = pki.root / f"{name}-cas.pem"
    bundle.write_bytes(pki.ca.read_bytes() + (pki.root / "other" / certs.CA_CERT).read_bytes())
    doc["security"]["tls_ca"] = str(bundle)
    path.write_text(yaml.safe_dump(doc))
    return path


def put_as(addr: str, pki: Pki, stem: str, caller: str, request: pb.KvPutRequest,
           header: str | None) -> tuple[grpc.StatusCode, str]:
    """A KvPut over stem's certificate naming `caller` as forwarded, with the proof header when given."""
    metadata = [(TOKEN_HEADER, pki.token.read_text().strip()), (auth.ON_BEHALF_OF, caller)]
    if header is not None:
        metadata.append((proof.PROOF_HEADER, header))

    async def go() -> tuple[grpc.StatusCode, str]:
        ch = channel(addr, pki, stem)
        try:
            await ch.unary_unary("/dpeer.v1.Peer/KvPut")(request.SerializeToString(), metadata=tuple(metadata),
                                                         timeout=30.0)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        finally:
            await ch.close()
        return grpc.StatusCode.OK, ""

    return asyncio.run(go())


def kv_get(addr: str, pki: Pki, key: str) -> str | None:
    got = cli("kv", "get", key, "--addr", addr, *operator_flags(pki))
    assert got.returncode in (0, 1), got.stderr
    return got.stdout.strip() if got.returncode == 0 else None


def test_operator_rights_come_only_from_an_operators_key(daemons, pki: Pki, tmp_path: Path) -> None:
    n1 = daemons.start("n1", config=pki.config("n1", "node-n1"))
    n2 = daemons.start("n2", join=[n1.addr], config=pki.config("n2", "node-n2"))
    # n3 knows only n2: unless n2 happens to lead, its join reaches the leader forwarded, with its proof
    n3 = daemons.start("n3", join=[n2.addr], config=trusting_both_cas(pki, "n3"))
    doc = formed(n3.addr, {"n1", "n2", "n3"}, security=pki.security("operator-alice"))
    nodes = {"n1": n1, "n2": n2, "n3": n3}
    leader = nodes[doc["leader"]]
    assert leader is not n3, "n3 leads; the test needs it to forward (the leader trusts the cluster's CA only)"
    other = "node-n1" if leader is n2 else "node-n2"  # a member's certificate, not the leader's

    # the outsider's finding: a node certificate, the token and the header committed a put
    code, why = put_as(leader.addr, pki, other, "operator/evil", pb.KvPutRequest(key="evil", value="1"), None)
    assert code == grpc.StatusCode.PERMISSION_DENIED, (code, why)
    assert "no proof from operator/evil's own certificate" in why, why
    # a proof made with that node's own key names the node, not the operator
    cert, key = pki.files(other)
    own = proof.Signer(cert.read_bytes(), key.read_bytes()).sign(
        "KvPut", pb.KvPutRequest(key="evil", value="1"), time.time(), b"\x01" * 16)
    code, why = put_as(leader.addr, pki, other, "operator/evil", pb.KvPutRequest(key="evil", value="1"), own)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "not operator/evil" in why, (code, why)
    assert kv_get(leader.addr, pki, "evil") is None, "a node certificate committed an operator's put"

    # the operator's own command through a follower: forwarded with the operator's proof, committed
    put = cli("kv", "put", "via-follower", "yes", "--addr", n3.addr, *operator_flags(pki))
    assert put.returncode == 0, put.stderr
    assert kv_get(leader.addr, pki, "via-follower") == "yes"
    deleted = cli("kv", "delete", "via-follower", "--addr", n3.addr, *operator_flags(pki))
    assert deleted.returncode == 0, deleted.stderr
    assert kv_get(leader.addr, pki, "via-follower") is None

    # a proof is taken once: a node that kept one cannot use it again, nor for another value
    cert, key = pki.files("operator-alice")
    alice = proof.Signer(cert.read_bytes(), key.read_bytes())
    request = pb.KvPutRequest(key="replayed", value="first")
    header = alice.sign("KvPut", request, time.time(), b"\x02" * 16)
    assert put_as(leader.addr, pki, other, "operator/alice", request, header)[0] == grpc.StatusCode.OK
    code, why = put_as(leader.addr, pki, other, "operator/alice", request, header)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "used before (a replay)" in why, (code, why)
    changed = pb.KvPutRequest(key="replayed", value="second")
    code, why = put_as(leader.addr, pki, other, "operator/alice", changed, header)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "does not match the request" in why, (code, why)
    assert kv_get(leader.addr, pki, "replayed") == "first"

    # an operator the follower lets in but whose proof the leader does not take hears why, in one sentence
    mallory = certs.create_client(pki.root / "other", tmp_path, "mallory", operator=True)
    refused = cli("kv", "put", "mallory", "1", "--addr", n3.addr, "--tls-ca", str(pki.root / "n3-cas.pem"),
                  "--tls-cert", str(mallory.cert), "--tls-key", str(mallory.key), "--token-file", str(pki.token))
    line = one_sentence(refused.stderr)
    assert refused.returncode == 1, (refused.returncode, line)
    assert line == (f"dpeer: refused: the leader ({leader.node_id}) refused KvPut forwarded by n3 for "
                    "operator/mallory: its proof's certificate is not issued by this cluster's CA (tls_ca)"), line
    assert kv_get(leader.addr, pki, "mallory") is None
