"""Structured logs: one JSON object per line, for requests, tasks and everything else.

`JsonFormatter` renders any log record as JSON with its message and the fields that
`ledger.middleware` (one `http_request` line per request) and `ledger.metrics` (one
`celery_task` line per task) attach through `extra=`. Idempotency keys never appear
raw: `key_digest` gives a SHA-256 prefix, enough to correlate and useless to replay.
"""

import hashlib
import json
import logging
from datetime import UTC, datetime
from typing import Any

# The attributes every LogRecord has; anything else came in through `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


def key_digest(key: str | None) -> str | None:
    """A short SHA-256 prefix of an Idempotency-Key, safe to log."""
    if not key:
        return None
    return hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:16]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_"):
                entry[name] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)
