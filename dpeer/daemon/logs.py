"""The daemon's logs on stderr: one JSON object a line (the default, for log shippers) or one
readable text line a record (`log_format: text`), each carrying node, term and generation; a
traceback is kept whole (JSON: the `traceback` field; text: indented lines under its record)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Callable, Literal, Mapping

Context = Callable[[], Mapping[str, object]]
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["json", "text"]
LEVELS: Mapping[str, int] = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                             "error": logging.ERROR}
TRACEBACK = "traceback"  # the field that carries a whole traceback (an exception's, or a worker's from its stderr)


def record_fields(record: logging.LogRecord) -> dict[str, object]:
    """The `extra=fields(...)` of a record, with the whole traceback of a logged exception."""
    out = dict(record.__dict__.get("fields", {}))
    if record.exc_info:
        text = logging.Formatter().formatException(record.exc_info)
        out.setdefault("error", text.splitlines()[-1])
        out[TRACEBACK] = text
    return out


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line, merged with the node's live context."""

    def __init__(self, context: Context) -> None:
        super().__init__()
        self._context = context

    def format(self, record: logging.LogRecord) -> str:
        """One line: ts, level, logger, msg, the node context, and any `extra` fields (an
        exception as `error`, its last line, and `traceback`, the whole of it)."""
        doc: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(self._context())
        doc.update(record_fields(record))
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """Formats a record as one readable line: UTC time, level, logger, message, then the node
    context and any fields as key=value; a traceback follows on indented lines."""

    def __init__(self, context: Context) -> None:
        super().__init__()
        self._context = context

    def format(self, record: logging.LogRecord) -> str:
        """`2025-06-01T10:00:00.123Z WARNING dpeer.daemon: msg  node=n1 term=3 generation=2`."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        extra = {**self._context(), **record_fields(record)}
        trace = extra.pop(TRACEBACK, None)
        pairs = " ".join(f"{key}={_text_value(value)}" for key, value in extra.items())
        line = f"{stamp} {record.levelname} {record.name}: {_one_line(record.getMessage())}"
        line = f"{line}  {pairs}" if pairs else line
        if trace:
            line += "".join(f"\n    {row}" for row in str(trace).rstrip("\n").splitlines())
        return line


def _one_line(text: str) -> str:
    """A message on one line: line breaks written as \\n."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _text_value(value: object) -> str:
    """A field's value as logfmt writes it: bare when it has no space, quote or '=', else quoted."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not any(c in text for c in ' ="\\\n\r\t'):
        return text
    return json.dumps(text)


FORMATTERS: Mapping[str, Callable[[Context], logging.Formatter]] = {"json": JsonFormatter, "text": TextFormatter}


def setup(context: Context, level: LogLevel = "info", fmt: LogFormat = "json") -> None:
    """Send every dpeer log record of `level` and above to stderr, as JSON lines or text lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FORMATTERS[fmt](context))
    root = logging.getLogger("dpeer")
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level])
    root.propagate = False
    logging.Formatter.converter = time.gmtime


def fields(**values: object) -> dict[str, dict[str, object]]:
    """`extra=` for a log call that adds structured fields: log.info("msg", extra=fields(x=1))."""
    return {"fields": values}
