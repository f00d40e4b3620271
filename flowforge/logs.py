"""JSON-lines logging: one object per record, context from `extra=`, never payloads."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

# Attributes every LogRecord has; anything else came from `extra=` and is context.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Format records as single-line JSON objects."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "thread": record.threadName,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging() -> None:
    """Send JSON lines to stderr at FLOWFORGE_LOG_LEVEL (default INFO)."""
    root = logging.getLogger()
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.handlers[:] = [handler]
    root.setLevel(os.environ.get("FLOWFORGE_LOG_LEVEL", "INFO").upper())
    # pika logs each failed connection attempt several times over, as ERRORs with
    # tracebacks (7 lines per reconnect); the worker's own loop says it once per attempt,
    # with the error (worker/loop.py report), so pika's own lines are only noise.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
