"""Structured logging: one JSON object per line on stderr, with any `extra=` fields kept."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """Formats a record as a single JSON line: ts, level, logger, msg, then extra fields."""

    def __init__(self, *, service: str | None = None) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.service:
            entry["service"] = self.service
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        # default=str: a log line must never fail because a value is not JSON-able.
        return json.dumps(entry, default=str, ensure_ascii=False)


def setup_logging(
    level: str = "INFO",
    *,
    json_format: bool = True,
    service: str | None = None,
    stream: TextIO | None = None,
) -> None:
    """Configure the root logger once per process; calling it again replaces the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if json_format:
        handler.setFormatter(JsonFormatter(service=service))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # librdkafka and httpx are chatty at INFO; their warnings still come through.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(root.level, logging.WARNING))
