"""How a command reports an error: one sentence on stderr, or under --json one JSON object
{"error", "exit_code"} on stderr (stdout keeps only the answer)."""

from __future__ import annotations

import json
import sys
from typing import Sequence


def wants_json(argv: Sequence[str]) -> bool:
    """Whether the command line asks for --json (before a `--`), for errors met before or while
    the flags are parsed."""
    args = list(argv)
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def error_line(message: str, code: int, as_json: bool) -> str:
    """The error as the one line stderr gets."""
    return json.dumps({"error": message, "exit_code": code}, sort_keys=True) if as_json else f"dpeer: {message}"


def report(message: str, code: int, as_json: bool) -> int:
    """Write the error to stderr (when it still leads anywhere: a closed terminal's does not); returns code."""
    try:
        print(error_line(message, code, as_json), file=sys.stderr, flush=True)
    except OSError:
        pass
    return code
