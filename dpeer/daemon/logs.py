"""Structured logs: one JSON object a line, each carrying node, term and generation."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Callable, Mapping

Context = Callable[[], Mapping[str, object]]


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line, merged with the node's live context."""

    def __init__(self, context: Context) -> None:
        super().__init__()
        self._context = context

    def format(self, record: logging.LogRecord) -> str:
        """One line: ts, level, logger, msg, the node context, and any `extra` fields."""
        doc: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(self._context())
        for key, value in record.__dict__.get("fields", {}).items():
            doc[key] = value
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(doc, default=str)


def setup(context: Context, level: int = logging.INFO) -> None:
    """Send every dpeer log record to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(context))
    root = logging.getLogger("dpeer")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    logging.Formatter.converter = time.gmtime


def fields(**values: object) -> dict[str, dict[str, object]]:
    """`extra=` for a log call that adds structured fields: log.info("msg", extra=fields(x=1))."""
    return {"fields": values}
