"""Where random ids come from: the source a node is built with, never `secrets` read in passing.

Production draws from the operating system (`SECRETS`); a simulation hands each box a `SeededIds`
so a seed replays the same store uids, boot ids and view secrets without patching `secrets`.
A store uid is 32 lowercase hex digits (128 random bits); `valid_uid` is its one check.
"""

from __future__ import annotations

import random
import re
import secrets
from typing import Any, Protocol

UID_BYTES = 16
UID_PATTERN = re.compile(r"[0-9a-f]{32}")


class Ids(Protocol):
    """A source of random hex ids."""

    def token_hex(self, nbytes: int) -> str:
        """nbytes random bytes as 2 * nbytes lowercase hex digits."""


class SecretIds:
    """The operating system's randomness (`secrets`): what every production node draws from."""

    def token_hex(self, nbytes: int) -> str:
        """nbytes from secrets.token_hex."""
        return secrets.token_hex(nbytes)


class SeededIds:
    """Ids from a seeded generator: the same seed, the same ids, in any process."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def token_hex(self, nbytes: int) -> str:
        """nbytes drawn from the seeded generator."""
        return self._rng.getrandbits(8 * nbytes).to_bytes(nbytes, "big").hex()


SECRETS: Ids = SecretIds()


def new_uid(ids: Ids) -> str:
    """A fresh store identity drawn from ids."""
    return ids.token_hex(UID_BYTES)


def valid_uid(value: Any) -> bool:
    """True for a store identity: 32 lowercase hex digits (128 random bits)."""
    return type(value) is str and UID_PATTERN.fullmatch(value) is not None
