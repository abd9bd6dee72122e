"""Log output of splitserve's processes: plain text or one JSON object per line.

    configure_logging("json")     # once per process (router replica, controller actor)

Everything under the `splitserve` logger goes to stderr (Ray collects it per worker). A record
may carry structured fields in `extra={"fields": {...}}` (the request log does): the JSON format
puts them at the top level of the object, the text format appends them as `key=value`.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

ROOT = "splitserve"
FIELDS = "fields"  # the `extra` key of structured fields
_HANDLER_NAME = "splitserve-stderr"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, FIELDS, None)
    return fields if isinstance(fields, dict) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC ISO 8601), level, logger, msg, the record's
    structured fields, and `exc` with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...` (values with spaces JSON-quoted)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The standard line, then the structured fields."""
        line = super().format(record)
        fields = _fields(record)
        if not fields:
            return line
        return line + " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())


def _text_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    text = str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' "=\n')) else text


def configure_logging(fmt: Literal["text", "json"] = "text", level: int | str = logging.INFO
                      ) -> None:
    """Send the `splitserve` loggers at `level` and above (a number or a name such as "DEBUG")
    to the current stderr in `fmt`; calling again replaces the handler (never two)."""
    logger = logging.getLogger(ROOT)
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
