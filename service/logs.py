"""Structured logs: one JSON object per line (or plain text for a terminal).

Every line has ``ts`` (ISO 8601, UTC, microseconds), ``level``, ``logger`` and ``msg``; during
a request also ``request_id`` and, once known, ``trace_id``, ``operation_id`` and ``attempt``
(:func:`service.telemetry.log_fields`); then the call's ``extra`` fields, which win.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from service.config import Settings
from service.telemetry import log_fields

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging"]

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    # uvicorn's copy of its message with ANSI colour codes, for its own formatter only
    "color_message",
}

# Libraries whose INFO lines say nothing an operator needs: alembic announces every plugin
# and context; httpx and httpcore log one line per HTTP call (the provider, the feeds).
_QUIET = ("alembic", "httpx", "httpcore")


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = log_fields()
    fields.update((k, v) for k, v in record.__dict__.items() if k not in _RESERVED)
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = _fields(record)
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if extra:
            line += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(settings: Settings, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    # the access line is service.telemetry's (JSON, with the request id), not uvicorn's
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
