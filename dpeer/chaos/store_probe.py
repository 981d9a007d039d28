"""A stranger speaking the rendezvous store's own wire (dpeer/trainer/rendezvous_wire.py) with keys
it guessed, so its requests reach the store's real request handling, not only its framing.

The wire: the store greets each connection with MAGIC and a 16-byte nonce; a request is a 4-byte
big-endian length, then HMAC-SHA256(key, b"q" + nonce + body) and the msgpack body
[generation, counter, op, args]; an answer is framed alike, with body [counter, status, result].
The chaos package may not import the trainer (tests/test_layers.py), so the frames are built here;
tests/chaos/test_store_probe.py checks them against rendezvous_wire and a live store.

Each probe is one connection with one request under a guessed key: the key a view without a secret
would derive, or random bytes. The store must close the connection (a generation it serves: the
tag does not verify) or answer, untagged, that it serves no such generation; any other answer means
it ran a stranger's request.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import random
import struct
from typing import Any

import msgpack

MAGIC = b"dpeerRV1"
NONCE_BYTES = 16
TAG_BYTES = 32
NEXT_GENERATIONS = 2  # probed besides the current generation: views the stranger expects to come
BIG_VALUE = 256 << 10  # the most one value may hold (rendezvous_table.Limits.max_value): a frame of it fits
NOT_SERVED = "unknown"  # the store's status for a generation it holds no key for
_LEN = struct.Struct(">I")


class Outcome(str, enum.Enum):
    """How the store met one request of the stranger's."""

    REFUSED = "refused"  # it closed the connection without an answer (a generation it serves)
    NOT_SERVED = "not served"  # it answered, untagged, that it serves no such generation
    RAN = "ran"  # it answered the request as a member's: the guessed key was taken
    SILENT = "silent"  # no greeting or answer in time (a worker that does not host a store now)


def guessed_key(generation: int, rng: random.Random) -> bytes:
    """A key the stranger tries: derived as a member derives it (group.derive) from an empty
    secret, or random bytes, by a coin of rng."""
    if rng.random() < 0.5:
        return hmac.new(b"", f"dpeer/rendezvous/{generation}".encode(), hashlib.sha256).digest()
    return rng.randbytes(32)


def request(key: bytes, nonce: bytes, generation: int, counter: int, op: str, args: list[Any]) -> bytes:
    """One request frame as a member sends it on the connection greeted with nonce."""
    body = msgpack.packb([generation, counter, op, args], use_bin_type=True)
    payload = hmac.new(key, b"q" + nonce + body, hashlib.sha256).digest() + body
    return _LEN.pack(len(payload)) + payload


def probes(generation: int | None, rng: random.Random) -> list[tuple[int, bytes, str, list[Any]]]:
    """The requests of one visit, each (generation, key, op, args): for the current generation (1
    when none is known) and the next NEXT_GENERATIONS, `sealed` set to "abandoned" (which stalled a
    group on torch's TCPStore), a get of `sealed`, and a set of a BIG_VALUE-byte value."""
    first = max(generation or 1, 1)
    out = []
    for g in range(first, first + 1 + NEXT_GENERATIONS):
        for op, args in (("compare_set", ["sealed", b"", b"abandoned"]), ("get", ["sealed"]),
                         ("set", [f"stranger-{rng.getrandbits(32):08x}", rng.randbytes(BIG_VALUE)])):
            out.append((g, guessed_key(g, rng), op, args))
    return out


def outcome_of(payload: bytes) -> Outcome:
    """What an answer's payload (tag and body) says: not served, or ran (any other status)."""
    try:
        message = msgpack.unpackb(payload[TAG_BYTES:], raw=False)
    except (ValueError, msgpack.UnpackException):
        return Outcome.RAN  # an answer, but not the untagged "not served" a refusal would be
    served = not (type(message) is list and len(message) == 3 and message[1] == NOT_SERVED)
    return Outcome.RAN if served else Outcome.NOT_SERVED


async def probe(host: str, port: int, generation: int, key: bytes, op: str, args: list[Any],
                timeout: float) -> tuple[Outcome, int]:
    """Send one request on a connection of its own; the outcome and the bytes sent (OSError when
    the connection could not be made)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    sent = 0
    try:
        greeting = await asyncio.wait_for(reader.readexactly(len(MAGIC) + NONCE_BYTES), timeout)
        if not greeting.startswith(MAGIC):
            return Outcome.SILENT, sent
        frame = request(key, greeting[len(MAGIC):], generation, 1, op, args)
        writer.write(frame)
        await asyncio.wait_for(writer.drain(), timeout)
        sent = len(frame)
        (length,) = _LEN.unpack(await asyncio.wait_for(reader.readexactly(_LEN.size), timeout))
        return outcome_of(await asyncio.wait_for(reader.readexactly(length), timeout)), sent
    except (asyncio.IncompleteReadError, ConnectionError):
        return Outcome.REFUSED, sent
    except TimeoutError:
        return Outcome.SILENT, sent
    finally:
        writer.close()
