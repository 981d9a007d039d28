"""Channel and server settings shared by both ends: message bounds, reconnect backoff, TLS, token."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from dpeer.security.auth import ON_BEHALF_OF, TLS_SERVER_NAME, Mode, Vouch, mode_of
from dpeer.security.proof import PROOF_HEADER

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""Largest single message either side accepts; bulk data travels in chunks below this."""

MAX_BATCH_MESSAGES = 256
"""Most envelopes one EnvelopeBatch on a peer's Stream may carry."""

TOKEN_HEADER = "x-dpeer-token"


@dataclass(frozen=True)
class Security:
    """Mutual TLS material and the cluster token; all None means plaintext on a trusted network."""

    cert: bytes | None = None
    key: bytes | None = None
    ca: bytes | None = None
    token: str | None = None

    @classmethod
    def from_files(
        cls, cert: Path | None, key: Path | None, ca: Path | None, token_file: Path | None
    ) -> "Security":
        """Read the PEM files and token named in the config; all three TLS files or none."""
        tls = [cert, key, ca]
        if any(tls) and not all(tls):
            raise ValueError("mutual TLS needs all of security.tls_cert, tls_key and tls_ca")
        token = token_file.read_text().strip() if token_file else None
        if token_file and not token:
            raise ValueError(f"cluster token file {token_file} is empty")
        read = lambda p: p.read_bytes() if p else None  # noqa: E731
        return cls(read(cert), read(key), read(ca), token)

    @property
    def tls(self) -> bool:
        """True when peers must present certificates signed by our CA."""
        return self.cert is not None

    @property
    def mode(self) -> Mode:
        """Which of mutual TLS and the cluster token this node requires."""
        return mode_of(self.tls, bool(self.token))


STREAM_WINDOW_BYTES = 4 * 1024 * 1024
"""Fixed HTTP/2 stream window: 4 MiB per round trip (40 MB/s per stream at a 100 ms RTT)."""

HTTP2_OPTIONS: list[tuple[str, int | str]] = [
    # No BDP probing: it answers almost every small message (a SWIM probe, an idle beat) with an
    # HTTP/2 PING round trip, about 12 % of an idle daemon's CPU (BENCHMARKS.md "Membership").
    # The window it would tune is fixed instead, large enough for chunked resync on a WAN.
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES),
]
"""HTTP/2 settings both ends use."""


def channel_options() -> list[tuple[str, int | str]]:
    """Bounded messages and a short reconnect backoff, so a restarted peer is reached again quickly."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 500),
        ("grpc.enable_retries", 0),
        # Gossip finds a dead peer in seconds; the keepalive only bounds how long a connection
        # that died silently (no RST: a cable pulled, a NAT entry dropped) goes unnoticed: 60 s
        # plus the 20 s ping timeout. Every 10 s cost about 8 % of an idle daemon's CPU.
        ("grpc.keepalive_time_ms", 60_000),
        *HTTP2_OPTIONS,
    ]


def open_channel(addr: str, security: Security) -> grpc.aio.Channel:
    """A channel to addr, secured with mutual TLS when configured."""
    options = channel_options()
    if not security.tls:
        return grpc.aio.insecure_channel(addr, options=options)
    creds = grpc.ssl_channel_credentials(security.ca, security.key, security.cert)
    options.append(("grpc.ssl_target_name_override", TLS_SERVER_NAME))
    return grpc.aio.secure_channel(addr, creds, options=options)


def call_metadata(security: Security) -> tuple[tuple[str, str], ...]:
    """Metadata sent with every call: the cluster token when one is set."""
    return ((TOKEN_HEADER, security.token),) if security.token else ()


def forwarding_metadata(metadata: tuple[tuple[str, str], ...], vouch: Vouch | None) -> tuple[tuple[str, str], ...]:
    """metadata plus the caller a node forwards a command for (auth.ON_BEHALF_OF) and that caller's
    proof, passed on unchanged (proof.PROOF_HEADER), when there are."""
    if vouch is None:
        return metadata
    proof = ((PROOF_HEADER, vouch.proof),) if vouch.proof else ()
    return metadata + ((ON_BEHALF_OF, vouch.caller),) + proof
