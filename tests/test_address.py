"""Address: parsed once from host:port text and written back the same way."""

from __future__ import annotations

import pytest

from dpeer.address import Address


@pytest.mark.parametrize("text, host, port", [
    ("127.0.0.1:7100", "127.0.0.1", 7100),
    ("box-3.example:1", "box-3.example", 1),
    ("[::1]:7100", "::1", 7100),
    ("[fe80::1%eth0]:65535", "fe80::1%eth0", 65535),
])
def test_parse_and_write_back(text: str, host: str, port: int) -> None:
    addr = Address.parse(text)
    assert addr == (host, port) and str(addr) == text and f"{addr}" == text


@pytest.mark.parametrize("text, why", [
    ("127.0.0.1", "is not host:port"), (":7100", "is not host:port"), ("h:", "the port"), ("h:0", "1-65535"),
    ("h:65536", "the port"), ("h:-1", "the port"), ("h:7e2", "the port"), ("[]:7100", "is not host:port"),
])
def test_bad_text_says_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Address.parse(text)


def test_port_zero_only_where_the_os_picks_one() -> None:
    assert Address.parse("127.0.0.1:0", any_port=True) == ("127.0.0.1", 0)
    with pytest.raises(ValueError):
        Address.parse("127.0.0.1:0")


@pytest.mark.parametrize("text, expected", [
    ("10.0.0.1:7101", Address("10.0.0.1", 7101)),
    ("[::1]:29500", Address("::1", 29500)),
    ("::1:29500", Address("::1", 29500)),  # what code before Address wrote for an IPv6 store host
    (":8", Address("", 8)),
    ("[]:8", Address("", 8)),
    ("h", Address("h", 0)),
    ("h:x", Address("h", 0)),
    ("", Address("", 0)),
])
def test_read_takes_any_committed_text_and_reads_its_own_output_back(text: str, expected: Address) -> None:
    assert Address.read(text) == expected
    assert Address.read(str(Address.read(text))) == expected
