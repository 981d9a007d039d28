"""Who may call what: principals, the per-method policy, identity claims, and quiet refusal logs.

Pure (no grpc, asyncio or clock): the transport finds the caller's principal (its certificate's
``dpeer://ROLE/NAME`` URI, or the cluster token when there are no certificates) and asks
`authorize` before any handler sees the request; `claims` lists every node id a request speaks
for, each of which must be the caller's own. A node forwarding a command to the leader names
the caller it authenticated (`ON_BEHALF_OF`); the leader believes that only from a node, and
beyond what that node may do itself only with the caller's own proof (security/proof.py).
"""

from __future__ import annotations

import contextvars
import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterable

URI_SCHEME = "dpeer://"
TLS_SERVER_NAME = "dpeer"
"""The DNS name every node certificate carries and every client checks, so boxes can move between
addresses (NAT, clouds); which node answered is not checked by clients, only that it is a node."""
ON_BEHALF_OF = "x-dpeer-on-behalf-of"
"""Metadata a forwarding node adds: the principal it authenticated, as ROLE/NAME."""


class CallerRole(enum.Enum):
    """What a caller is to this cluster."""

    NODE = "node"  # a cluster member: peer RPCs, under its own node id only
    OPERATOR = "operator"  # may change the cluster (kv put, leave, force) and read the log
    CLIENT = "client"  # may read status and settings
    TOKEN = "token"  # holds the cluster token on a cluster without certificates: everything
    ANONYMOUS = "anonymous"  # no credential at all (a cluster without security)
    UNKNOWN = "unknown"  # a certificate of our CA that names no dpeer role


class Mode(enum.Enum):
    """The security a node runs with."""

    MTLS_TOKEN = "mtls+token"
    MTLS = "mtls"
    TOKEN = "token"
    NONE = "none"


def mode_of(tls: bool, token: bool) -> Mode:
    """The mode a node runs in with (or without) its TLS files and token."""
    if tls:
        return Mode.MTLS_TOKEN if token else Mode.MTLS
    return Mode.TOKEN if token else Mode.NONE


class Need(enum.Enum):
    """What a call needs."""

    READ = "read"
    PEER = "peer"
    OPERATOR = "operator"
    LOG = "log"  # committed entries and checkpoints: members' nodes (as themselves) and operators


class Refusal(enum.Enum):
    """Why a call was refused; the metrics' reason label."""

    UNAUTHENTICATED = "unauthenticated"  # no or wrong token, no role in the certificate
    FORBIDDEN = "forbidden"  # the role may not make this call
    IDENTITY = "identity"  # the request speaks for a node id that is not the caller's
    INVALID = "invalid"  # the request does not decode or fails validation


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a role and a name (a node id for nodes)."""

    role: CallerRole
    name: str = ""

    def __str__(self) -> str:
        return f"{self.role.value}/{self.name}" if self.name else self.role.value


ANONYMOUS = Principal(CallerRole.ANONYMOUS)


@dataclass(frozen=True)
class Caller:
    """Who a call is judged as, the node that forwarded it to us (None: it came directly), and the
    caller's proof that came with it (passed on unchanged when this node forwards the call)."""

    principal: Principal
    via: Principal | None = None
    proof: str | None = None


@dataclass(frozen=True)
class Vouch:
    """What a forwarding node sends along: the caller it names (ROLE/NAME) and that caller's proof."""

    caller: str
    proof: str | None = None


CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("dpeer_caller", default=None)
"""The caller of the RPC the current task serves; read where a handler forwards a command."""


def identity_uri(role: CallerRole, name: str) -> str:
    """The SAN URI a certificate carries for role and name: dpeer://node/ID."""
    return f"{URI_SCHEME}{role.value}/{name}"


def parse_principal(text: str) -> Principal | None:
    """ROLE/NAME (or a full dpeer:// URI) as a principal of a certificate role; None when it is not one."""
    role, _, name = text.removeprefix(URI_SCHEME).partition("/")
    valid = {CallerRole.NODE.value, CallerRole.OPERATOR.value, CallerRole.CLIENT.value}
    if role not in valid or not name or len(name) > 64 or not name.isprintable() or "/" in name:
        return None
    return Principal(CallerRole(role), name)


def principal_from_uris(uris: Iterable[str]) -> Principal:
    """The role a certificate's URIs name; UNKNOWN when none (or more than one) is a dpeer identity."""
    found = {p for p in (parse_principal(u) for u in uris if u.startswith(URI_SCHEME)) if p is not None}
    return found.pop() if len(found) == 1 else Principal(CallerRole.UNKNOWN)


# -- the policy -----------------------------------------------------------------------------------
NEEDS: dict[str, Need] = {
    "Deliver": Need.PEER, "Stream": Need.PEER, "Join": Need.PEER, "GroupFailed": Need.PEER,
    "ReportCheckpoint": Need.PEER, "FetchEntries": Need.LOG,
    "FetchCheckpoint": Need.LOG, "Force": Need.OPERATOR, "KvPut": Need.OPERATOR, "JobControl": Need.OPERATOR,
    "KvDelete": Need.OPERATOR, "Status": Need.READ, "KvGet": Need.READ, "KvList": Need.READ,
    "Leave": Need.OPERATOR,  # but a node may commit its own leave through the leader (authorize)
}


_BODY_CLAIMS = {"ping": "hb.node_id", "ping_req": "hb.node_id", "nack": "hb.node_id", "gossip": "hb.node_id",
                "push_pull": "hb.node_id", "vote_request": "candidate", "append_request": "leader",
                "raft_heartbeat": "leader", "snapshot_request": "leader"}


def envelope_claims(envelope: Any) -> list[str]:
    """Node ids an Envelope speaks for: its sender, and the sender named inside its message (an
    Ack's heartbeat is exempt: an indirect probe's relay passes on the target's)."""
    out = [envelope.from_id]
    body = envelope.WhichOneof("body")
    path = _BODY_CLAIMS.get(body or "")
    if path is not None:
        value: Any = getattr(envelope, body)
        for part in path.split("."):
            value = getattr(value, part)
        out.append(value)
    return out


def claims(method: str, request: Any) -> list[str]:
    """Every node id the request speaks for (each must be the calling node's own)."""
    if method == "Deliver":
        return envelope_claims(request)
    if method == "Stream":
        return [c for envelope in request.envelopes for c in envelope_claims(envelope)]
    if method in ("Join", "GroupFailed", "ReportCheckpoint", "FetchEntries", "Leave"):
        return [request.node_id]
    return []


def authorize(mode: Mode, method: str, request: Any, caller: Principal) -> tuple[Refusal, str] | None:
    """None when caller may make this call, else why not (the refusal and one sentence)."""
    if mode is Mode.NONE or caller.role is CallerRole.TOKEN:
        return None  # no certificates: the token (or nothing) is the whole of the trust
    if caller.role in (CallerRole.UNKNOWN, CallerRole.ANONYMOUS):
        return Refusal.UNAUTHENTICATED, "the certificate names no dpeer role (make it with `dpeer certs`)"
    wanted = NEEDS[method]
    if method == "Leave" and request.forwarded and caller.role is CallerRole.NODE:
        wanted = Need.PEER  # a node committing its own leave through the leader
    if wanted is Need.READ:
        return None
    if wanted is Need.OPERATOR:
        if caller.role is CallerRole.OPERATOR:
            return None
        return Refusal.FORBIDDEN, f"{method} is an operator command and {caller} holds no operator certificate"
    if wanted is Need.LOG and caller.role is CallerRole.OPERATOR:
        return None
    if caller.role is not CallerRole.NODE:
        return Refusal.FORBIDDEN, f"{method} is a peer call and {caller} is not a node"
    forged = sorted({c for c in claims(method, request) if c != caller.name})
    if forged:
        return Refusal.IDENTITY, f"node {caller.name!r} may not speak for {forged[0][:64]!r}"
    return None


def vouch(caller: Caller | None) -> Vouch | None:
    """What a node forwarding the current call sends along (None: nothing to vouch for)."""
    if caller is None or caller.principal.role not in (CallerRole.NODE, CallerRole.OPERATOR, CallerRole.CLIENT):
        return None
    return Vouch(str(caller.principal), caller.proof)


# The calls a node forwards to the leader for the caller it took them from (daemon/serve/service.py's
# _via_leader); only these may carry ON_BEHALF_OF. Raft and gossip messages never do, nor Force
# (it acts on the addressed node).
FORWARDED = frozenset({"Join", "Leave", "GroupFailed", "ReportCheckpoint", "KvPut", "KvGet", "KvDelete", "KvList",
                       "JobControl"})
SIGNED = frozenset(m for m in FORWARDED if NEEDS[m] is not Need.READ)
"""The calls a client holding a key signs (security/proof.py): all a node may forward but reads."""


def effective(caller: Principal, on_behalf_of: str | None, method: str, receiver: str,
              may_forward: Callable[[str], bool]) -> Principal | tuple[Refusal, str]:
    """The principal a call is judged as, or why it is refused. A node forwarding a command names
    the caller it took it from; that is believed only for the commands nodes forward, only from a
    node that may_forward says is a member of the cluster (not a stranger or a retired box holding
    an old certificate), and never in the receiving node's own name (a node's requests are its own
    to make, never forwarded back to it). What the named caller may do beyond the node's own
    rights needs its proof besides (`beyond_the_node`)."""
    if on_behalf_of is None or caller.role is not CallerRole.NODE:
        return caller
    if method not in FORWARDED:
        return Refusal.IDENTITY, f"{method} is never forwarded: {caller} may not name another caller"
    if caller.name == receiver:
        return Refusal.IDENTITY, f"{caller} is this node's own certificate: a node forwards nothing to itself"
    if not may_forward(caller.name):
        return Refusal.IDENTITY, f"{caller} is no member of this cluster and may not forward for others"
    vouched = parse_principal(on_behalf_of)
    if vouched is None:
        return Refusal.UNAUTHENTICATED, "the forwarded caller names no dpeer role"
    if vouched.role is CallerRole.NODE and vouched.name == receiver:
        return Refusal.IDENTITY, f"{caller} may not forward a request in this node's own name"
    return vouched


def member_only(caller: Principal, method: str, is_member: Callable[[str], bool]) -> tuple[Refusal, str] | None:
    """Why a node's certificate may not read this cluster's log or checkpoints, or None: the log
    holds each view's secret (the keys of the store, the pair proof and the heal derive from it),
    so a node reads it only while is_member says it is a member (not a certificate made for a box
    never admitted, nor a retired box's). Operators read the log whatever is_member says."""
    if NEEDS[method] is not Need.LOG or caller.role is not CallerRole.NODE or is_member(caller.name):
        return None
    return (Refusal.FORBIDDEN, f"{method} reads the cluster's log or checkpoints and {caller} is no member of "
            "this cluster (never admitted, or it left); start it with --join to join first")


def beyond_the_node(mode: Mode, method: str, request: Any, caller: Caller) -> bool:
    """Whether a forwarded call asks more than its forwarding node may ask itself (then only the
    named caller's own proof lets it through); False for a call that came directly."""
    return caller.via is not None and authorize(mode, method, request, caller.via) is not None


def unproven(receiver: str, method: str, via: Principal, named: Principal, problem: str) -> tuple[Refusal, str]:
    """The refusal of a forwarded call beyond its node's rights whose proof failed, in one sentence."""
    return Refusal.FORBIDDEN, f"the leader ({receiver}) refused {method} forwarded by {via.name} for {named}: {problem}"


# -- quiet refusal logs ------------------------------------------------------------------------------
class RefusalLog:
    """Decides which refusals to log: the first of each kind (a method and reason) from each peer per
    `interval` seconds, with how many were held back since, so a fuzzer cannot flood the log.
    Bounded in memory."""

    def __init__(self, interval: float = 10.0, max_keys: int = 4096) -> None:
        self.interval, self.max_keys = interval, max_keys
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def should_log(self, peer: str, kind: str, now: float) -> int | None:
        """The number held back since the last line when this refusal should be logged, else None."""
        key = (peer, kind)
        seen = self._last.get(key)
        if seen is not None and now - seen[0] < self.interval:
            self._last[key] = (seen[0], seen[1] + 1)
            return None
        if seen is None and len(self._last) >= self.max_keys:
            self._last = {k: v for k, v in self._last.items() if now - v[0] < self.interval}
            if len(self._last) >= self.max_keys:
                self._last.pop(next(iter(self._last)))
        self._last[key] = (now, 0)
        return seen[1] if seen is not None else 0
