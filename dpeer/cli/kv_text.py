"""`dpeer kv` text in and out: keys and values printed one unambiguous line each, and a value read
from stdin or a file, bounded by what a node accepts."""

from __future__ import annotations

from typing import BinaryIO

_NAMED = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
MAX_UTF8_BYTES = 4  # the most bytes one character takes in UTF-8


def escape(text: str) -> str:
    """text with backslashes, control and other unprintable characters written as Python escapes
    (\\t, \\n, \\x1b, \\u202e ...), so a key or value prints as one line a tab can separate."""
    out = []
    for ch in text:
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "".join(out)


def read_value(stream: BinaryIO, source: str, max_chars: int) -> str:
    """The whole stream as UTF-8 text, exactly (a trailing newline is kept); ValueError naming
    source when it is longer than max_chars characters or not UTF-8. Reads no more than the
    longest text that could fit, so a huge file costs nothing."""
    limit = max_chars * MAX_UTF8_BYTES
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{source} holds more than {max_chars} characters, the most a value may have")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{source} is not UTF-8 text (byte {exc.start} is not); a value is text") from None
    if len(text) > max_chars:
        raise ValueError(f"{source} holds {len(text)} characters; a value may have at most {max_chars}")
    return text
