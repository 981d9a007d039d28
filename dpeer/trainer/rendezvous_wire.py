"""The rendezvous store's wire: a greeting with a fresh nonce, then length-prefixed frames, each
HMAC-tagged under the generation's rendezvous key and bound to that connection's nonce.

A connection opens with the server's greeting (MAGIC and a 16-byte nonce). Each request is
``[generation, counter, op, args]`` and each reply ``[counter, status, result]``, msgpack-encoded
and tagged with HMAC-SHA256(key, direction + nonce + body); the counter counts up from 1 on each
connection, so a request copied from one connection (or replayed on it) does not verify. Only a
reply that says the generation is unknown here goes untagged (the server has no key for it), and
a client takes it as "try again", nothing more. Pure: bytes in, bytes out.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Any

import msgpack

MAGIC = b"dpeerRV1"
NONCE_BYTES = 16
GREETING_BYTES = len(MAGIC) + NONCE_BYTES
TAG_BYTES = 32
NO_TAG = bytes(TAG_BYTES)
MAX_FRAME = 320 << 10
"""The largest frame either side accepts (a value of Limits.max_value and its envelope fit)."""
_LEN = struct.Struct(">I")
LEN_BYTES = _LEN.size


class WireError(ValueError):
    """Bytes that are not a well-formed, authentic frame; the text says which."""


def greeting(nonce: bytes) -> bytes:
    """What the server sends first on every connection."""
    return MAGIC + nonce


def read_greeting(data: bytes) -> bytes:
    """The nonce of a server's greeting; WireError when whoever answered is no dpeer rendezvous store."""
    if len(data) != GREETING_BYTES or not data.startswith(MAGIC):
        raise WireError("the port answered, but not as a dpeer rendezvous store")
    return data[len(MAGIC):]


def tag(key: bytes, direction: bytes, nonce: bytes, body: bytes) -> bytes:
    """The frame's authentication tag."""
    return hmac.new(key, direction + nonce + body, hashlib.sha256).digest()


def frame(key: bytes | None, direction: bytes, nonce: bytes, message: list[Any]) -> bytes:
    """One frame holding message, tagged with key (untagged when key is None)."""
    body = msgpack.packb(message, use_bin_type=True)
    mac = NO_TAG if key is None else tag(key, direction, nonce, body)
    payload = mac + body
    if len(payload) > MAX_FRAME:
        raise WireError(f"a frame of {len(payload)} bytes is over the {MAX_FRAME}-byte bound")
    return _LEN.pack(len(payload)) + payload


def frame_length(header: bytes) -> int:
    """The payload length a frame's 4-byte header announces; WireError when out of bounds."""
    (length,) = _LEN.unpack(header)
    if not TAG_BYTES < length <= MAX_FRAME:
        raise WireError(f"a frame of {length} bytes is out of bounds")
    return length


def split(payload: bytes) -> tuple[bytes, bytes, list[Any]]:
    """A frame's payload as (tag, body, decoded message); WireError when the body is no list."""
    mac, body = payload[:TAG_BYTES], payload[TAG_BYTES:]
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise WireError(f"a frame does not decode: {str(exc)[:80]}") from None
    if type(message) is not list:
        raise WireError("a frame holds no list")
    return mac, body, message


def verify(key: bytes, direction: bytes, nonce: bytes, mac: bytes, body: bytes) -> bool:
    """Whether mac is the tag of body under key on this connection."""
    return hmac.compare_digest(mac, tag(key, direction, nonce, body))
