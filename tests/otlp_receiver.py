"""A minimal OTLP/HTTP traces receiver for tests: `POST /v1/traces` with a protobuf
`ExportTraceServiceRequest` body, answered 200; every span kept with its resource attributes.

    with OtlpReceiver() as rx:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = rx.base_url  # the SDK appends /v1/traces
        ...
        spans = rx.wait_for(lambda spans: any(s.name == "splitserve.kv_transfer" for s in spans))
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived over the wire (ids as hex)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope: str


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def _attrs(kvs) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class OtlpReceiver:
    """An OTLP/HTTP receiver on 127.0.0.1 (a free port), in a daemon thread."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = ExportTraceServiceRequest.FromString(body)
                got = [
                    ReceivedSpan(
                        name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex() or None,
                        attributes=_attrs(s.attributes), resource=_attrs(rs.resource.attributes),
                        scope=ss.scope.name,
                    )
                    for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans
                ]
                with receiver._lock:
                    receiver.paths.append(self.path)
                    receiver.spans.extend(got)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT (the exporter appends /v1/traces)."""
        return f"http://127.0.0.1:{self.server.server_port}"

    @property
    def traces_url(self) -> str:
        """For OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or `tracing.otlp_endpoint` (used as is)."""
        return f"{self.base_url}/v1/traces"

    def received(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30
    ) -> list[ReceivedSpan]:
        """The spans received once `done(spans)` holds (or the timeout passed: the caller's
        assertions then say what is missing)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.received()
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()
