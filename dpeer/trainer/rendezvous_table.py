"""The rendezvous store's contents: one key space per generation, bounded, with the operations
torch.distributed's stores offer (set, get, add, compare_set, check, delete, num_keys).

Pure (no sockets, clock or torch): the server (rendezvous.py) authenticates each request before it
reaches the table, so only a generation's members ever write here; the bounds keep a member that
misbehaves (or a bug) from growing the worker without limit. A generation's keys live until a
newer generation is allowed and more than ``KEEP_GENERATIONS`` are.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

KEEP_GENERATIONS = 2


@dataclass(frozen=True)
class Limits:
    """How much one generation may hold: keys, bytes of keys and values, one value, one key name."""

    max_keys: int = 4096
    max_bytes: int = 32 << 20
    max_value: int = 256 << 10
    max_key: int = 512


LIMITS = Limits()


class Status(enum.Enum):
    """How a request ended."""

    OK = "ok"
    ABSENT = "absent"  # get of a key not (yet) set: the client polls
    UNKNOWN = "unknown"  # no such generation here (not yet allowed, or dropped): the client retries
    REFUSED = "refused"  # over a bound, or malformed: the reason is the result


class Op(enum.Enum):
    """The operations a request names."""

    SET = "set"
    GET = "get"
    ADD = "add"
    COMPARE_SET = "compare_set"
    CHECK = "check"
    DELETE = "delete"
    NUM_KEYS = "num_keys"


@dataclass
class _Space:
    values: dict[str, bytes] = field(default_factory=dict)
    size: int = 0


class RendezvousTable:
    """Every allowed generation's keys; `apply` runs one request against one generation."""

    def __init__(self, limits: Limits = LIMITS) -> None:
        self.limits = limits
        self._spaces: dict[int, _Space] = {}

    def allow(self, generation: int) -> list[int]:
        """Open generation's key space (kept if open); drops the oldest beyond KEEP_GENERATIONS and
        returns the generations dropped."""
        self._spaces.setdefault(generation, _Space())
        dropped = sorted(self._spaces)[:-KEEP_GENERATIONS]
        for g in dropped:
            del self._spaces[g]
        return dropped

    def allowed(self, generation: int) -> bool:
        """Whether requests for generation are served."""
        return generation in self._spaces

    def apply(self, generation: int, op: str, args: list[Any]) -> tuple[Status, Any]:
        """Run op with args in generation's key space: (status, result)."""
        space = self._spaces.get(generation)
        if space is None:
            return Status.UNKNOWN, f"generation {generation} is not served here"
        try:
            kind = Op(op)
        except ValueError:
            return Status.REFUSED, f"unknown operation {str(op)[:32]!r}"
        try:
            return getattr(self, f"_{kind.value}")(space, *args)
        except (TypeError, ValueError) as exc:
            return Status.REFUSED, f"bad arguments to {kind.value}: {str(exc)[:120]}"

    # -- the operations (argument types are checked here: requests come off a socket) -----
    def _key(self, key: Any) -> str:
        if type(key) is not str or not key or len(key) > self.limits.max_key:
            raise ValueError(f"a key is a string of 1-{self.limits.max_key} characters")
        return key

    def _value(self, value: Any) -> bytes:
        if type(value) is not bytes:
            raise ValueError("a value is bytes")
        if len(value) > self.limits.max_value:
            raise ValueError(f"a value holds at most {self.limits.max_value} bytes, not {len(value)}")
        return value

    def _put(self, space: _Space, key: str, value: bytes) -> tuple[Status, Any] | None:
        old = space.values.get(key)
        grown = len(value) - (len(old) if old is not None else -len(key))
        if old is None and len(space.values) >= self.limits.max_keys:
            return Status.REFUSED, f"the generation holds {self.limits.max_keys} keys already"
        if space.size + grown > self.limits.max_bytes:
            return Status.REFUSED, f"the generation would hold more than {self.limits.max_bytes} bytes"
        space.values[key] = value
        space.size += grown
        return None

    def _set(self, space: _Space, key: Any, value: Any) -> tuple[Status, Any]:
        return self._put(space, self._key(key), self._value(value)) or (Status.OK, None)

    def _get(self, space: _Space, key: Any) -> tuple[Status, Any]:
        value = space.values.get(self._key(key))
        return (Status.ABSENT, None) if value is None else (Status.OK, value)

    def _add(self, space: _Space, key: Any, amount: Any) -> tuple[Status, Any]:
        key = self._key(key)
        if type(amount) is not int or abs(amount) >= 1 << 62:
            raise ValueError("an amount is an integer below 2**62")
        total = int(space.values.get(key, b"0")) + amount
        return self._put(space, key, str(total).encode()) or (Status.OK, total)

    def _compare_set(self, space: _Space, key: Any, expected: Any, desired: Any) -> tuple[Status, Any]:
        """torch's TCPStore semantics: set desired when the key holds expected (absent counts as b"");
        answer the value the key holds afterwards (expected, when absent and not set)."""
        key, expected, desired = self._key(key), self._value(expected), self._value(desired)
        current = space.values.get(key)
        if (current is None and expected == b"") or current == expected:
            return self._put(space, key, desired) or (Status.OK, desired)
        return Status.OK, expected if current is None else current

    def _check(self, space: _Space, keys: Any) -> tuple[Status, Any]:
        if type(keys) is not list or len(keys) > self.limits.max_keys:
            raise ValueError("check takes a list of keys")
        return Status.OK, all(self._key(k) in space.values for k in keys)

    def _delete(self, space: _Space, key: Any) -> tuple[Status, Any]:
        key = self._key(key)
        old = space.values.pop(key, None)
        if old is not None:
            space.size -= len(key) + len(old)
        return Status.OK, old is not None

    def _num_keys(self, space: _Space) -> tuple[Status, Any]:
        return Status.OK, len(space.values)
