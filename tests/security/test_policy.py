"""The access policy as a table: every Peer method, every role, every claimed node id."""

from __future__ import annotations

import pytest

from dpeer.security import auth, exposure
from dpeer.security.auth import CallerRole, Mode, Principal, Refusal
from dpeer.proto.v1 import dpeer_pb2 as pb

NODE, OTHER = Principal(CallerRole.NODE, "n1"), Principal(CallerRole.NODE, "n2")
OPERATOR, CLIENT = Principal(CallerRole.OPERATOR, "alice"), Principal(CallerRole.CLIENT, "bob")
UNKNOWN = Principal(CallerRole.UNKNOWN)
SERVICE = pb.DESCRIPTOR.services_by_name["Peer"]


def requests(claim: str) -> dict[str, object]:
    """One request per Peer method, each naming `claim` wherever a node id is claimed."""
    hb = pb.Heartbeat(node_id=claim, addr="127.0.0.1:1")
    return {
        "Deliver": pb.Envelope(from_id=claim, ping=pb.Ping(seq=1, target="x", hb=hb)),
        "Stream": pb.EnvelopeBatch(envelopes=[pb.Envelope(from_id=claim, vote_request=pb.VoteRequest(term=9, candidate=claim))]),
        "FetchEntries": pb.FetchEntriesRequest(node_id=claim, from_index=1),
        "Join": pb.JoinRequest(node_id=claim, addr="127.0.0.1:1"),
        "Leave": pb.LeaveRequest(node_id=claim, forwarded=True),
        "GroupFailed": pb.GroupFailedRequest(node_id=claim, generation=1),
        "Force": pb.ForceRequest(voters=[claim], confirm=True),
        "ReportCheckpoint": pb.CheckpointReport(node_id=claim, step=1, digest="ab" * 32),
        "Status": pb.StatusRequest(),
        "KvPut": pb.KvPutRequest(key="k", value="v"),
        "KvGet": pb.KvGetRequest(key="k"),
        "KvDelete": pb.KvDeleteRequest(key="k"),
        "KvList": pb.KvListRequest(prefix="k"),
        "JobControl": pb.JobControlRequest(action="retry"),
        "FetchCheckpoint": pb.FetchCheckpointRequest(step=1),
    }


def test_every_method_of_the_proto_has_a_policy() -> None:
    assert set(auth.NEEDS) == {m.name for m in SERVICE.methods} == set(requests("n1"))


@pytest.mark.parametrize("method", sorted(auth.NEEDS))
def test_roles_and_claims(method: str) -> None:
    own, forged = requests("n1")[method], requests("n9")[method]
    need = auth.NEEDS[method]
    for mode in (Mode.MTLS, Mode.MTLS_TOKEN):
        verdict = lambda caller, request=own: auth.authorize(mode, method, request, caller)  # noqa: E731
        assert verdict(UNKNOWN)[0] is Refusal.UNAUTHENTICATED
        if need is auth.Need.READ:
            assert verdict(NODE) is verdict(OPERATOR) is verdict(CLIENT) is None
        elif need is auth.Need.OPERATOR:
            assert verdict(OPERATOR) is None
            assert verdict(CLIENT)[0] is Refusal.FORBIDDEN
            if method != "Leave":
                assert verdict(NODE)[0] is Refusal.FORBIDDEN, "a node certificate is no operator credential"
        else:
            assert verdict(NODE) is None
            assert verdict(CLIENT)[0] is Refusal.FORBIDDEN
            if need is auth.Need.LOG:
                assert verdict(OPERATOR) is None, "operators may read the log"
            else:
                assert verdict(OPERATOR)[0] is Refusal.FORBIDDEN, "an operator is not a node"
        if auth.claims(method, own):
            assert verdict(NODE, forged)[0] is Refusal.IDENTITY, "a node speaking for another is refused"
            assert verdict(OTHER)[0] is Refusal.IDENTITY
        # without certificates the token (or, without security, nothing) is the whole of the trust
        assert auth.authorize(Mode.TOKEN, method, forged, Principal(CallerRole.TOKEN)) is None
        assert auth.authorize(Mode.NONE, method, forged, auth.ANONYMOUS) is None


def test_leave_of_the_node_itself_or_another_is_an_operator_command() -> None:
    serving = pb.LeaveRequest()
    other = pb.LeaveRequest(node_id="n2", forwarded=True)
    assert auth.authorize(Mode.MTLS, "Leave", serving, NODE)[0] is Refusal.FORBIDDEN
    assert auth.authorize(Mode.MTLS, "Leave", serving, CLIENT)[0] is Refusal.FORBIDDEN
    assert auth.authorize(Mode.MTLS, "Leave", other, NODE)[0] is Refusal.IDENTITY
    assert auth.authorize(Mode.MTLS, "Leave", other, OPERATOR) is None
    assert auth.authorize(Mode.MTLS, "Leave", pb.LeaveRequest(node_id="n1", forwarded=True), NODE) is None


def test_raft_and_gossip_envelopes_claim_their_sender_inside_too() -> None:
    def env(**body: object) -> pb.Envelope:
        return pb.Envelope(from_id="n1", **body)

    assert auth.envelope_claims(env(vote_request=pb.VoteRequest(candidate="n2"))) == ["n1", "n2"]
    assert auth.envelope_claims(env(append_request=pb.AppendRequest(leader="n3"))) == ["n1", "n3"]
    assert auth.envelope_claims(env(raft_heartbeat=pb.RaftHeartbeat(leader="n3"))) == ["n1", "n3"]
    assert auth.envelope_claims(env(gossip=pb.Gossip(hb=pb.Heartbeat(node_id="n4")))) == ["n1", "n4"]
    assert auth.envelope_claims(env(ack=pb.Ack(hb=pb.Heartbeat(node_id="n5")))) == ["n1"], "a relayed ack"
    assert auth.envelope_claims(env(append_response=pb.AppendResponse())) == ["n1"]


def test_only_a_node_may_name_the_caller_it_forwards_for() -> None:
    def judged(caller: Principal, header: str, method: str = "KvPut") -> Principal | tuple:
        return auth.effective(caller, header, method, "leader", lambda n: n in ("n1", "n2"))
    assert judged(NODE, "operator/alice") == OPERATOR
    assert judged(NODE, "junk")[0] is auth.Refusal.UNAUTHENTICATED
    assert judged(CLIENT, "operator/alice") == CLIENT, "a client cannot promote itself"
    assert judged(OPERATOR, "node/n1") == OPERATOR
    assert auth.vouch(auth.Caller(Principal(CallerRole.TOKEN))) is None and auth.vouch(None) is None
    vouched = auth.vouch(auth.Caller(OPERATOR, proof="1.2.3"))
    assert vouched is not None and auth.parse_principal(vouched.caller) == OPERATOR and vouched.proof == "1.2.3"
    assert auth.principal_from_uris(["dpeer://node/n1", "dpeer://operator/x"]).role is CallerRole.UNKNOWN


def test_refusals_are_logged_once_per_peer_and_method_per_interval() -> None:
    quiet = auth.RefusalLog(interval=10.0, max_keys=3)
    assert quiet.should_log("1.2.3.4", "Join", 0.0) == 0
    assert all(quiet.should_log("1.2.3.4", "Join", t / 100) is None for t in range(1, 1000))
    assert quiet.should_log("1.2.3.4", "Leave", 1.0) == 0, "another method is another line"
    assert quiet.should_log("1.2.3.4", "Join", 10.5) == 999, "the next line says how many were held back"
    for i in range(100):  # a fuzzer from many addresses cannot grow the table without bound
        quiet.should_log(f"10.0.0.{i}", "Join", 11.0)
    assert len(quiet._last) <= 3


@pytest.mark.parametrize("host,mode,insecure,starts", [
    ("127.0.0.1", Mode.NONE, False, True), ("::1", Mode.TOKEN, False, True), ("localhost", Mode.MTLS, False, True),
    ("0.0.0.0", Mode.NONE, False, False), ("10.0.0.1", Mode.MTLS, False, False),
    ("10.0.0.1", Mode.TOKEN, False, False), ("10.0.0.1", Mode.TOKEN, True, False),
    ("box1.lan", Mode.NONE, True, True), ("10.0.0.1", Mode.MTLS_TOKEN, False, True),
])
def test_who_may_start_where(host: str, mode: Mode, insecure: bool, starts: bool) -> None:
    reason = exposure.refusal(host, mode, insecure)
    assert (reason is None) == starts, reason
    if reason is not None:
        assert "dpeer certs" in reason and reason.count(". ") == 0
    warned = exposure.warning(host, mode, insecure)
    assert (warned is not None) == (insecure and mode is not Mode.MTLS_TOKEN)


@pytest.mark.parametrize("host,job,insecure,data_plane,runs", [
    ("127.0.0.1", True, False, False, True), ("10.0.0.1", False, False, False, True),
    ("10.0.0.1", True, False, False, False), ("10.0.0.1", True, False, True, True), ("10.0.0.1", True, True, False, True),
    ("::1", True, False, False, True), ("box1.lan", True, False, False, False),
])
def test_a_secured_node_runs_an_unencrypted_data_plane_off_loopback_only_when_told(
        host: str, job: bool, insecure: bool, data_plane: bool, runs: bool) -> None:
    """Issue 35: the collectives and heal authenticate each connection but do not encrypt; off
    loopback a secured node says so and starts only with --insecure-data-plane (which warns)."""
    reason = exposure.data_plane_refusal(host, job, insecure, data_plane)
    assert (reason is None) == runs, reason
    if reason is not None:
        assert "--insecure-data-plane" in reason and host in reason and reason.count(". ") == 0
    warned = exposure.data_plane_warning(host, job, insecure, data_plane)
    assert (warned is not None) == (runs and job and not exposure.is_loopback(host)), warned
