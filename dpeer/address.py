"""Network addresses as (host, port) values: parsed once from "host:port" text (a bracketed
IPv6 host included) and written back the same way, instead of split and joined at each use.
The log, the config and the wire keep the text form; code in between holds an Address."""

from __future__ import annotations

from typing import NamedTuple


class Address(NamedTuple):
    """A host (an IPv6 one without its brackets) and a port."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str, *, any_port: bool = False) -> Address:
        """The address written as HOST:PORT or [IPV6]:PORT; ValueError saying why it is not one.
        any_port: port 0 (the OS picks one) is allowed too."""
        host, port = _split(text)
        if port is None or not host:
            raise ValueError(f"{text!r} is not host:port")
        if not _is_number(port) or not (0 if any_port else 1) <= int(port) <= 65535:
            raise ValueError(f"{text!r}: the port must be a number in {0 if any_port else 1}-65535")
        return cls(host, int(port))

    @classmethod
    def read(cls, text: str) -> Address:
        """The address a committed entry or snapshot holds, as any version wrote it; never raises.
        Text that parse() refuses still reads as the same value on every node and after a
        snapshot's round trip: an empty host, or port 0 when the port is missing or not a number.
        No store listens there, so a worker given it fails its group, which re-forms."""
        host, port = _split(text)
        return cls(host, int(port) if port is not None and _is_number(port) else 0)

    def __str__(self) -> str:
        """HOST:PORT, with an IPv6 host in brackets."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _split(text: str) -> tuple[str, str | None]:
    """HOST (brackets of an IPv6 host removed) and the text after the last colon (None: no colon)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, None
    return (host[1:-1] if host.startswith("[") and host.endswith("]") else host), port


def _is_number(port: str) -> bool:
    return port.isascii() and port.isdigit()
