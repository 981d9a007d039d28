"""Proof that a forwarded command comes from its caller's own key: signed by the caller, checked by the leader.

A node that forwards a command to the leader names the caller it took it from (auth.ON_BEHALF_OF);
a node's certificate must not be enough to claim rights the node lacks (an operator's). So the
caller's client signs every command a node may forward: its certificate, a timestamp and a random
nonce, and a signature with its key over a canonical encoding of the method and the request's
fields. The forwarding node passes the proof on unchanged and the leader checks it against the
request it receives. Pure: the caller of `sign` and `Verifier.check` supplies the time and nonce.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import re
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa

from dpeer.security.auth import CallerRole, Principal, principal_from_uris

PROOF_HEADER = "x-dpeer-proof"
"""Metadata carrying a caller's proof: 1.TIME_MS.NONCE.CERT.SIGNATURE (the last two base64url DER)."""
FRESH_S = 60.0
"""A proof is accepted while the checking node's clock is within this many seconds of its time."""
MAX_NONCES = 10_000
"""Nonces remembered at most for the signers of one role (each until its proof is stale): operators'
and nodes' are held apart, so no flood of node proofs keeps an operator's out."""
MAX_PER_SIGNER = 1_000
"""Nonces remembered at most for one signer; past it, that signer's new proofs (and no one else's)
wait for its old ones to go stale."""
MAX_HEADER = 8192
_VERSION = "1"
_NONCE = re.compile(r"[0-9a-f]{32}")
_B64 = re.compile(r"[A-Za-z0-9_-]+")
_PURPOSE = "dpeer forwarded call proof v1"


class ProofError(ValueError):
    """A proof cannot be made or checked: one phrase saying why."""


def _plain(value: Any) -> Any:
    """A request field's value as JSON holds it exactly (bytes as base64, a repeated field as a list)."""
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float):
        return repr(value)
    if hasattr(value, "ListFields"):
        return _fields(value)
    try:
        return [_plain(v) for v in value]
    except TypeError:
        raise ProofError(f"a field of type {type(value).__name__} cannot be signed") from None


def _fields(request: Any) -> dict[str, Any]:
    """The request's set fields by name (protobuf's ListFields: a field at its default is absent,
    so a newer peer's unset field changes nothing)."""
    return {field.name: _plain(value) for field, value in request.ListFields()}


def canonical(method: str, request: Any, time_ms: int, nonce: str) -> bytes:
    """The bytes a proof signs: what is asked (the method and every field the request sets), when,
    and a nonce; the leader rebuilds them from the request it receives."""
    doc = {"purpose": _PURPOSE, "method": method, "fields": _fields(request), "time_ms": time_ms, "nonce": nonce}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    """Strict unpadded base64url; ValueError on any other character."""
    if not _B64.fullmatch(text):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature_args(key: Any) -> tuple[Any, ...]:
    """What key.sign / public_key.verify take besides the data, by key type."""
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        return (ec.ECDSA(hashes.SHA256()),)
    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        return (padding.PKCS1v15(), hashes.SHA256())
    if isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey, ed448.Ed448PrivateKey,
                        ed448.Ed448PublicKey)):
        return ()
    raise ProofError(f"a {type(key).__name__} cannot sign a proof (use an EC, RSA or Ed25519 key)")


class Signer:
    """Makes proofs with one certificate and its key (a node's, an operator's)."""

    def __init__(self, cert_pem: bytes, key_pem: bytes) -> None:
        try:
            self._cert = _b64(x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER))
            self._key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise ProofError(f"the certificate or key cannot sign proofs: {exc}") from None
        self._args = _signature_args(self._key)

    def sign(self, method: str, request: Any, now: float, nonce: bytes) -> str:
        """The PROOF_HEADER value proving this caller asks `method` with exactly these fields at `now`
        (wall-clock seconds); nonce: 16 random bytes."""
        time_ms, nonce_hex = int(now * 1000), nonce.hex()
        signature = self._key.sign(canonical(method, request, time_ms, nonce_hex), *self._args)  # type: ignore[union-attr]
        return ".".join((_VERSION, str(time_ms), nonce_hex, self._cert, _b64(signature)))


def _load_cas(ca_pem: bytes) -> list[x509.Certificate]:
    try:
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        raise ProofError(f"the cluster CA cannot be read: {exc}") from None
    return [ca for ca in cas if _is_ca(ca)]


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def identity(cert: x509.Certificate) -> Principal:
    """The dpeer identity a certificate names (its dpeer:// URI); role UNKNOWN when none."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return principal_from_uris([])
    return principal_from_uris(sans.get_values_for_type(x509.UniformResourceIdentifier))


class _Held:
    """One signer's accepted nonces, each with the time it may be forgotten (its proof is stale)."""

    __slots__ = ("nonces", "soonest")

    def __init__(self) -> None:
        self.nonces: dict[str, float] = {}
        self.soonest = math.inf  # no nonce here expires before this

    def add(self, nonce: str, expires: float) -> None:
        """Hold nonce until expires."""
        self.nonces[nonce] = expires
        self.soonest = min(self.soonest, expires)

    def expire(self, now: float) -> int:
        """Forget the nonces whose proofs are stale at now; how many went."""
        if now <= self.soonest:
            return 0
        before = len(self.nonces)
        self.nonces = {n: t for n, t in self.nonces.items() if t >= now}
        self.soonest = min(self.nonces.values(), default=math.inf)
        return before - len(self.nonces)


class Verifier:
    """Checks proofs against the cluster's CA and remembers each accepted nonce while its proof is
    fresh, so a proof is accepted once per node. Memory is bounded per signer (max_per_signer)
    and per role of signer (max_nonces), so one signer's flood refuses that signer alone and
    nodes' proofs never crowd out operators'."""

    def __init__(self, ca_pem: bytes, fresh_s: float = FRESH_S, max_nonces: int = MAX_NONCES,
                 max_per_signer: int = MAX_PER_SIGNER) -> None:
        self._cas = _load_cas(ca_pem)
        self.fresh_s, self.max_nonces, self.max_per_signer = fresh_s, max_nonces, max_per_signer
        self._held: dict[Principal, _Held] = {}
        self._pooled: dict[CallerRole, int] = {}  # nonces held for the signers of each role

    def check(self, header: str | None, method: str, request: Any, claimed: Principal, now: float) -> str | None:
        """None when header proves that `claimed` asked exactly this request within FRESH_S of now
        (wall-clock seconds) and it was not seen before; else why not, as one phrase."""
        if header is None:
            return (f"no proof from {claimed}'s own certificate came with it (a node's certificate alone "
                    f"grants no {claimed.role.value} rights)")
        try:
            time_ms, nonce, cert, signature = _parse(header)
        except ProofError as exc:
            return f"its proof is malformed ({exc})"
        skew = abs(now - time_ms / 1000)
        if skew > self.fresh_s:
            return (f"its proof was made {skew:.0f} s off this node's clock (at most {self.fresh_s:.0f} s): "
                    "check both clocks (NTP), then run the command again")
        problem = self._certificate(cert, claimed, now)
        if problem is not None:
            return problem
        public = cert.public_key()
        try:
            public.verify(signature, canonical(method, request, time_ms, nonce), *_signature_args(public))  # type: ignore[call-arg,arg-type]
        except (InvalidSignature, ProofError, ValueError):
            return "its proof's signature does not match the request (altered on the way, or made for another)"
        return self._once(claimed, nonce, time_ms / 1000 + self.fresh_s, now)

    def forget(self, header: str, claimed: Principal) -> None:
        """Let an accepted proof's nonce go (the command it proved failed and may be tried again)."""
        try:
            nonce = _parse(header)[1]
        except ProofError:
            return
        held = self._held.get(claimed)
        if held is not None and held.nonces.pop(nonce, None) is not None:
            self._pooled[claimed.role] -= 1
            if not held.nonces:
                del self._held[claimed]

    def held(self, role: CallerRole) -> int:
        """How many nonces this verifier holds for the signers of role."""
        return self._pooled.get(role, 0)

    def _certificate(self, cert: x509.Certificate, claimed: Principal, now: float) -> str | None:
        """Why the proof's certificate cannot speak for claimed now, or None."""
        named = identity(cert)
        if named != claimed:
            return f"its proof is signed by {named}, not {claimed}"
        at = dt.datetime.fromtimestamp(now, dt.timezone.utc)
        if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
            return (f"its proof's certificate is valid only from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} "
                    f"to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        for ca in self._cas:
            try:
                cert.verify_directly_issued_by(ca)
            except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
                continue
            if ca.not_valid_before_utc <= at <= ca.not_valid_after_utc:
                return None
        return "its proof's certificate is not issued by this cluster's CA (tls_ca)"

    def _once(self, signer: Principal, nonce: str, expires: float, now: float) -> str | None:
        """Record a verified proof's nonce; why not when it was seen before, or when its signer (or
        its signer's role) holds its most fresh proofs already."""
        held = self._held.get(signer) or _Held()
        if nonce in held.nonces:
            return "its proof was used before (a replay); run the command again for a new one"
        if len(held.nonces) >= self.max_per_signer:
            self._pooled[signer.role] -= held.expire(now)
            if len(held.nonces) >= self.max_per_signer:
                return (f"this node holds {self.max_per_signer} fresh proofs of {signer} already (the most for "
                        "one caller within a minute); try again in a minute")
        if self.held(signer.role) >= self.max_nonces:
            self._expire(signer.role, now)
            if self.held(signer.role) >= self.max_nonces:
                return (f"this node holds {self.max_nonces} fresh proofs of {signer.role.value}s already; "
                        "try again in a minute")
        held.add(nonce, expires)
        self._held[signer] = held
        self._pooled[signer.role] = self.held(signer.role) + 1
        return None

    def _expire(self, role: CallerRole, now: float) -> None:
        """Forget the stale nonces of role's signers, and the signers left with none."""
        for signer in [s for s in self._held if s.role is role]:
            held = self._held[signer]
            self._pooled[role] -= held.expire(now)
            if not held.nonces:
                del self._held[signer]


def _parse(header: str) -> tuple[int, str, x509.Certificate, bytes]:
    """A PROOF_HEADER value's parts; ProofError naming what is wrong."""
    if len(header) > MAX_HEADER:
        raise ProofError(f"longer than {MAX_HEADER} characters")
    parts = header.split(".")
    if len(parts) != 5 or parts[0] != _VERSION:
        raise ProofError(f"not a version {_VERSION} proof of 5 parts")
    _, time_text, nonce, cert_text, signature_text = parts
    if not time_text.isdigit() or len(time_text) > 16 or not _NONCE.fullmatch(nonce):
        raise ProofError("its time or nonce is not a number of milliseconds and 32 hex digits")
    try:
        cert = x509.load_der_x509_certificate(_unb64(cert_text))
        signature = _unb64(signature_text)
    except ValueError as exc:
        raise ProofError(f"its certificate or signature does not decode: {str(exc)[:80]}") from None
    return int(time_text), nonce, cert, signature
