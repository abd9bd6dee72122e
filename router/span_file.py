"""A span exporter that appends each finished span to a file as one JSON line (config
`tracing.file`): for tests and debugging on one machine, where no OTLP collector runs.

The router runs inside Ray Serve replicas; a test reads the file to see their spans. Each line:

    {"name", "trace_id" (32 hex), "span_id" (16 hex), "parent_id" (16 hex or null),
     "kind", "start_ns", "end_ns", "status", "attributes": {...},
     "events": [{"name", "time_ns", "attributes"}]}

One `write` per span on a file opened in append mode, so several router replicas (processes) can
share a path without interleaving lines.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """The JSON-ready record of one finished span."""
    ctx, parent = span.get_span_context(), span.parent
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in span.events
        ],
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends spans to `path`, one JSON object per line."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write `spans` (one `os.write` each: an atomic append)."""
        with self._lock:
            if self._fd is None:
                return SpanExportResult.FAILURE
            for span in spans:
                line = json.dumps(span_record(span), default=str) + "\n"
                os.write(self._fd, line.encode())
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Close the file; later exports fail."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def read_spans(path: str) -> list[dict[str, Any]]:
    """The span records in `path` (a missing file: none)."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
