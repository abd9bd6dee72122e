"""OpenTelemetry tracing of one request through the router (config section `tracing`).

One trace per request; span names and attributes (GenAI semantic conventions where they exist):

    POST /v1/completions | POST /v1/chat/completions   SERVER; http.response.status_code,
    │                                                  splitserve.tenant, gen_ai.* (model, ids,
    │                                                  input/output tokens, max_tokens)
    └─ splitserve.dispatch                             splitserve.prefill_path (remote, local,
       │                                               offload, ...), predicted TTFT and TPOT
       ├─ splitserve.prefill                           remote path only; attempts, fallback
       │  ├─ splitserve.admission                      pool=prefill, queue wait
       │  └─ splitserve.prefill.attempt                one per try: attempt, replica, error.type
       ├─ splitserve.admission                         pool=decode, queue wait
       └─ splitserve.decode                            one per decode hop (a continuation on
          │                                            another replica after a failure has
          │                                            splitserve.decode.migration); replica,
          │                                            first_token event,
          │                                            splitserve.kv_transfer.bytes, cached and
          │                                            output tokens
          └─ splitserve.kv_transfer                    the KV pull the decode worker's NIXL
                                                       connector measured: bytes, blocks,
                                                       backend, duration_s (see `kv_transfer`);
                                                       a pull that failed or a handoff that
                                                       expired: status ERROR, event
                                                       kv_transfer.failed, kv.recomputed

The root span ends when the response is over: for a streamed response when its chunk stream is
closed (last event sent, client gone, or the response dropped), not when the handler returns.
An incoming W3C `traceparent` header makes the root span a child of the caller's span.

Configured by the `tracing` section and, for every key it leaves out (null), by OpenTelemetry's
standard environment as the router replica's process sees it (`tracing_enabled`, `_sampler`,
`_resource`, `_otlp_exporter`): OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT
(with _PROTOCOL, _HEADERS, _TIMEOUT, ... read by the exporter itself), OTEL_TRACES_SAMPLER
(+ _ARG), OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, OTEL_SDK_DISABLED. With `enabled` null,
tracing is on when an OTLP endpoint is known; OTEL_SDK_DISABLED=true turns it off in any case
(the SDK's TracerProvider would hand out no-op tracers anyway).

Off (`enabled: false`, or null with no endpoint): `NOOP_TRACING` has no tracer provider and
creates no span objects (`Tracing.start` returns OTel's shared `INVALID_SPAN`, `Tracing.request`
a shared no-op request trace whose `stream` returns the chunks unchanged), so the request path
only pays a few attribute checks. The provider is held by the `Tracing` object, never installed
globally: tests build their own with an in-memory exporter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_SDK_DISABLED,
)
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from splitserve.router.request_end import RequestEnd

from splitserve.config import TracingConfig
from splitserve.engine.routed import SETTLEMENT_LOST, SettlementLost

if TYPE_CHECKING:
    from splitserve.router.tenancy import Tenancy, Tenant, Ticket

    from splitserve.engine.messages import GenerateChunk, GenerateRequest
    from splitserve.engine.routed import Settlement

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "splitserve-router"  # `service.name` when neither config nor env name one

# Span names.
ADMISSION = "splitserve.admission"
DISPATCH = "splitserve.dispatch"
PREFILL = "splitserve.prefill"
PREFILL_ATTEMPT = "splitserve.prefill.attempt"
DECODE = "splitserve.decode"
KV_TRANSFER = "splitserve.kv_transfer"
FIRST_TOKEN = "first_token"  # event on the decode span
KV_FAILED = "kv_transfer.failed"  # event on the kv_transfer span: attribute `reason`

# Attribute names: OTel semantic conventions (HTTP, GenAI, error) ...
HTTP_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_STATUS = "http.response.status_code"
ERROR_TYPE = "error.type"
GENAI_OPERATION = "gen_ai.operation.name"
GENAI_MODEL = "gen_ai.request.model"
GENAI_MAX_TOKENS = "gen_ai.request.max_tokens"
GENAI_RESPONSE_ID = "gen_ai.response.id"
GENAI_FINISH_REASONS = "gen_ai.response.finish_reasons"
GENAI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GENAI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
# ... and splitserve's own.
TENANT = "splitserve.tenant"
STREAM = "splitserve.stream"
CANCELLED = "splitserve.cancelled"
POOL = "splitserve.pool"
QUEUE_WAIT = "splitserve.queue_wait_s"
QUEUE_DEPTH = "splitserve.queue_depth"
PROMPT_TOKENS = "splitserve.prompt_tokens"
PREFILL_PATH = "splitserve.prefill_path"
PREDICTED_TTFT = "splitserve.predicted_ttft_s"  # the disaggregation rule's prediction
PREDICTED_TPOT = "splitserve.predicted_tpot_s"
MIGRATION = "splitserve.decode.migration"  # on a decode span: which continuation it is
PREFILL_REMOTE = "splitserve.prefill.remote"  # decode got the KV from a remote prefill
PREFILL_ATTEMPTS = "splitserve.prefill.attempts"
ATTEMPT = "splitserve.prefill.attempt"
FALLBACK = "splitserve.prefill.fallback"
FALLBACK_REASON = "splitserve.prefill.fallback_reason"
REQUEST_ID = "splitserve.request_id"
REPLICA = "splitserve.replica"
DECODE_REPLICA = "splitserve.decode_replica"  # the decode replica reserved before the prefill
KV_BYTES = "splitserve.kv_transfer.bytes"
KV_BLOCKS = "splitserve.kv_transfer.blocks"
KV_BACKEND = "splitserve.kv_transfer.backend"
KV_SECONDS = "splitserve.kv_transfer.duration_s"  # measured by the connector (post to completion)
KV_RECOMPUTED = "splitserve.kv.recomputed"  # the decode engine recomputed the handoff's prompt
CACHED_TOKENS = "splitserve.cached_tokens"
TTFT = "splitserve.time_to_first_token_s"
ENGINE_TTFT = "splitserve.engine.time_to_first_token_s"  # the engine's own part of TTFT

# The router's endpoint names (`Router._serve`) -> (HTTP route, GenAI operation name).
_ROUTES = {
    "completions": ("/v1/completions", "text_completion"),
    "chat": ("/v1/chat/completions", "chat"),
}
_PROPAGATOR = TraceContextTextMapPropagator()


def error_type(err: BaseException) -> str:
    """The `error.type` of a failure: a tenancy refusal's reason, an API error's code or HTTP
    status, else the exception's class name."""
    reason = getattr(err, "reason", None) or getattr(err, "code", None)
    if isinstance(reason, str) and reason:
        return reason
    status = getattr(err, "status", None)
    if isinstance(status, int):
        return str(status)
    return type(err).__qualname__


def record_failure(span: Span, err: BaseException, *, kind: str | None = None) -> None:
    """Mark `span` failed by `err` (error status, `error.type`, the exception as an event); a
    cancellation (client gone, stream closed early) is marked `splitserve.cancelled` instead."""
    if not span.is_recording():
        return
    if isinstance(err, (GeneratorExit, asyncio.CancelledError)):
        span.set_attribute(CANCELLED, True)
        return
    span.set_status(Status(StatusCode.ERROR, f"{type(err).__name__}: {err}"))
    span.set_attribute(ERROR_TYPE, kind or error_type(err))
    span.record_exception(err)


class Tracing:
    """The router's tracer, from its own `TracerProvider` (never the global one), or off.

    Build with `from_config`; `NOOP_TRACING` is the shared disabled instance. Span helpers take
    an explicit parent `Context` (never the ambient one): a streamed request's spans end in
    another task than the one that started them, where attaching and detaching contexts fails.
    """

    def __init__(
        self, tracer: trace.Tracer | None = None, provider: TracerProvider | None = None
    ) -> None:
        self.tracer = tracer
        self.provider = provider
        self.enabled = tracer is not None

    @classmethod
    def from_config(
        cls, cfg: TracingConfig, *, exporter: SpanExporter | None = None
    ) -> Tracing:
        """A provider for `cfg`, each key it leaves out taken from OpenTelemetry's environment
        (see the module docstring): sampling `ParentBased(TraceIdRatioBased(sample_ratio))` or
        OTEL_TRACES_SAMPLER's sampler, exporting over OTLP in batches when `otlp_endpoint` or an
        OTEL_EXPORTER_OTLP_*ENDPOINT is set, as JSON lines to `file` when set (`span_file`),
        and synchronously to `exporter` (tests: an `InMemorySpanExporter`). Off
        (`tracing_enabled`): `NOOP_TRACING`, `exporter` unused."""
        if not tracing_enabled(cfg):
            return NOOP_TRACING
        provider = TracerProvider(sampler=_sampler(cfg), resource=_resource(cfg))
        if cfg.otlp_endpoint or _env_endpoint():
            provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(cfg.otlp_endpoint)))
        if cfg.file:
            from splitserve.router.span_file import JsonLinesSpanExporter

            provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(cfg.file)))
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        return cls(provider.get_tracer("splitserve.router"), provider)

    def shutdown(self) -> None:
        """Flush and stop the exporters (no-op when off)."""
        if self.provider is not None:
            self.provider.shutdown()

    def start(self, name: str, parent: Context | None) -> Span:
        """A new span under `parent` (None: the ambient context), or `INVALID_SPAN` when off.
        The caller ends it; set attributes only `if span.is_recording()` to keep off free."""
        if self.tracer is None:
            return INVALID_SPAN
        return self.tracer.start_span(name, context=parent)

    def context_of(self, span: Span) -> Context | None:
        """The context that makes `span` the parent of new spans (None when off)."""
        if self.tracer is None:
            return None
        return trace.set_span_in_context(span)

    def kv_transfer(
        self, hop: Span, last: GenerateChunk | None, params: Mapping[str, Any] | None,
        *, end_ns: int | None,
    ) -> None:
        """A `splitserve.kv_transfer` child of the decode `hop`, when its worker reported a
        measured transfer or a recomputed handoff on its `last` chunk. `params`: the decode
        request's handoff.

        The duration is the connector's measurement (NIXL telemetry, post to completion, the
        longest of the request's transfers); the placement is an approximation: the span ends
        at `end_ns`, when the hop's first chunk reached the router (None: now), a little after
        the transfer really ended (the first token's forward pass and the trip back lie between).
        A handoff the engine recomputed (`last.kv_recomputed`: the pull failed, or the handoff
        expired before the engine saw it) gives a failed span (status ERROR, `error.type` and a
        `kv_transfer.failed` event with the reason, `splitserve.kv.recomputed`), of zero length
        unless some transfer of the request was measured.
        """
        if not hop.is_recording() or last is None:
            return
        if last.kv_transfer_s is None and last.kv_recomputed is None:
            return
        end_ns = time.time_ns() if end_ns is None else end_ns
        span = self.tracer.start_span(  # type: ignore[union-attr] - recording: tracer is set
            KV_TRANSFER, context=trace.set_span_in_context(hop),
            start_time=end_ns - round((last.kv_transfer_s or 0.0) * 1e9),
        )
        span.set_attributes({
            KV_BYTES: last.kv_bytes, KV_BLOCKS: handoff_blocks(params), KV_BACKEND: "nixl",
        })
        if last.kv_transfer_s is not None:
            span.set_attribute(KV_SECONDS, last.kv_transfer_s)
        if last.kv_recomputed is not None:
            reason = last.kv_recomputed
            span.add_event(KV_FAILED, {"reason": reason}, timestamp=end_ns)
            span.set_attributes({KV_RECOMPUTED: True, ERROR_TYPE: reason})
            span.set_status(Status(StatusCode.ERROR, f"KV not pulled ({reason}); recomputed"))
        span.end(end_time=end_ns)

    def request(
        self, endpoint: str, headers: Mapping[str, str], *, model: str
    ) -> RequestTrace | NoopRequestTrace:
        """The root span of a request to `endpoint` ("completions" or "chat"), child of the
        caller's span when `headers` carry a W3C `traceparent`. End it with
        `RequestTrace.answered` (and, for a stream, by closing `RequestTrace.stream`)."""
        if self.tracer is None:
            return NOOP_REQUEST
        route, operation = _ROUTES.get(endpoint, (f"/v1/{endpoint}", endpoint))
        span = self.tracer.start_span(
            f"POST {route}",
            context=_PROPAGATOR.extract(headers),
            kind=SpanKind.SERVER,
        )
        if not span.is_recording():  # sampled out: children follow the decision, nothing else
            return NoopRequestTrace(trace.set_span_in_context(span))
        span.set_attributes({
            HTTP_METHOD: "POST", HTTP_ROUTE: route, GENAI_OPERATION: operation, GENAI_MODEL: model,
        })
        return RequestTrace(span)

    def admit(
        self, tenancy: Tenancy, pool: str, tenant: Tenant, prompt_tokens: int,
        parent: Context | None,
    ) -> contextlib.AbstractAsyncContextManager[Ticket]:
        """`tenancy.admit(pool, tenant, prompt_tokens)`, its gate wait as a `splitserve.admission`
        span under `parent` (off: the tenancy's own context manager, nothing added)."""
        if self.tracer is None:
            return tenancy.admit(pool, tenant, prompt_tokens)
        return self._admit(tenancy, pool, tenant, prompt_tokens, parent)

    @contextlib.asynccontextmanager
    async def _admit(
        self, tenancy: Tenancy, pool: str, tenant: Tenant, prompt_tokens: int,
        parent: Context | None,
    ) -> AsyncIterator[Ticket]:
        span = self.start(ADMISSION, parent)
        if span.is_recording():
            gate = tenancy.gates.get(pool)
            span.set_attributes({
                POOL: pool, TENANT: tenant.name, PROMPT_TOKENS: prompt_tokens,
                QUEUE_DEPTH: gate.queued if gate is not None else 0,
            })
        start = time.perf_counter()
        waiting = True
        try:
            async with tenancy.admit(pool, tenant, prompt_tokens) as ticket:
                span.set_attribute(QUEUE_WAIT, time.perf_counter() - start)
                span.end()
                waiting = False
                yield ticket
        except BaseException as err:
            if waiting:
                span.set_attribute(QUEUE_WAIT, time.perf_counter() - start)
                record_failure(span, err)
                span.end()
            raise


class NoopRequestTrace:
    """The request trace when tracing is off or the trace is sampled out: every method does
    nothing; `context` carries the sampled-out span (so children are dropped too) or None."""

    def __init__(self, context: Context | None = None) -> None:
        self.context = context

    def describe(self, **_: Any) -> None:
        """No-op (see `RequestTrace.describe`)."""

    def stream(self, chunks: AsyncIterator[GenerateChunk]) -> AsyncIterator[GenerateChunk]:
        """`chunks` unchanged."""
        return chunks

    def answered(self, status: int, error: BaseException | None = None) -> None:
        """No-op (see `RequestTrace.answered`)."""

    def settled(self, settlement: Settlement | None) -> None:
        """No-op (see `RequestTrace.settled`)."""


NOOP_REQUEST = NoopRequestTrace()


class RequestTrace(RequestEnd):
    """A recording request's root span. It ends once the handler has answered (`answered`)
    and the chunk stream it wrapped (`stream`), if it was started, is closed: whichever is
    last. Single event loop, like the rest of the request path."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.context: Context | None = trace.set_span_in_context(span)
        super().__init__()
        self._status: int | None = None
        self._error: BaseException | None = None
        self._stream_error: BaseException | None = None
        self._streamed_tokens = 0
        self._output_tokens: int | None = None  # set when the stream closes

    def describe(
        self, *, tenant: Tenant | None = None, request: GenerateRequest | None = None,
        stream: bool | None = None,
    ) -> None:
        """Record what the router learnt: the tenant, then the prepared worker request."""
        attrs: dict[str, Any] = {}
        if tenant is not None:
            attrs[TENANT] = tenant.name
        if request is not None:
            attrs[GENAI_RESPONSE_ID] = response_id(request)
            attrs[GENAI_INPUT_TOKENS] = len(request.prompt_token_ids)
            attrs[GENAI_MAX_TOKENS] = request.sampling.max_tokens
        if stream is not None:
            attrs[STREAM] = stream
        self.span.set_attributes(attrs)

    def _on_chunk(self, chunk: GenerateChunk) -> None:
        self._streamed_tokens += len(chunk.token_ids)

    def _on_stream_error(self, err: BaseException) -> None:
        self._stream_error = err

    def _on_stream_closed(self) -> None:
        self._output_tokens = self._streamed_tokens

    def answered(self, status: int, error: BaseException | None = None) -> None:
        """The handler is done: `status` sent (or `error` raised). Call exactly once."""
        if isinstance(error, asyncio.CancelledError):  # the handler was cancelled: no response
            self._cancelled = True
        else:
            self._status = status
            self._error = error
        self._release()

    def settled(self, settlement: Settlement | None) -> None:
        """A directly served request is over (router/direct.py; call instead of `answered`):
        its span ends with the figures of the `settlement` its replica sent, or, None, as
        failed (`SettlementLost`: the replica never settled it). A request the replica handed
        back to the router (not generated, not refused) is traced there: its span is dropped."""
        if settlement is None:
            self.answered(SETTLEMENT_LOST, SettlementLost("the replica never settled it"))
            return
        if settlement.handed_back:
            return
        self._output_tokens = settlement.output_tokens
        self._cancelled = settlement.cancelled
        self.answered(settlement.status)

    def _end(self) -> None:
        span = self.span
        if self._output_tokens is not None:
            span.set_attribute(GENAI_OUTPUT_TOKENS, self._output_tokens)
        if self._status is not None:
            span.set_attribute(HTTP_STATUS, self._status)
        if self._cancelled:
            span.set_attribute(CANCELLED, True)
        err = self._error or self._stream_error
        if err is not None:
            if self._status is not None and 400 <= self._status < 500:
                span.set_attribute(ERROR_TYPE, error_type(err))  # a client error: status unset
            else:  # 5xx, or a failure after the 200 went out (an error event mid-stream)
                record_failure(span, err)
        span.end()


NOOP_TRACING = Tracing()


def otel_sdk_disabled() -> bool:
    """OTEL_SDK_DISABLED=true (case-insensitive, as the SDK reads it)."""
    return os.environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true"


def _env_endpoint() -> str | None:
    """The OTLP traces endpoint OpenTelemetry's environment names, if any (the signal-specific
    variable first, as the exporters read them)."""
    for var in (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT):
        if os.environ.get(var, "").strip():
            return os.environ[var].strip()
    return None


def tracing_enabled(cfg: TracingConfig) -> bool:
    """Whether the router traces: never with OTEL_SDK_DISABLED=true; else `cfg.enabled` when
    given; else (null) when an OTLP endpoint is known, from `cfg.otlp_endpoint` or the
    environment (on Kubernetes, what the OpenTelemetry Operator injects)."""
    if otel_sdk_disabled():
        if cfg.enabled:
            log.warning("tracing.enabled is true but OTEL_SDK_DISABLED=true: tracing is off")
        return False
    if cfg.enabled is not None:
        return cfg.enabled
    return bool(cfg.otlp_endpoint or _env_endpoint())


def _sampler(cfg: TracingConfig) -> Sampler | None:
    """`ParentBased(TraceIdRatioBased(sample_ratio))`; None (sample_ratio null): the SDK's
    TracerProvider takes OTEL_TRACES_SAMPLER (+ OTEL_TRACES_SAMPLER_ARG), by default
    parentbased_always_on."""
    if cfg.sample_ratio is None:
        return None
    return ParentBased(TraceIdRatioBased(cfg.sample_ratio))


def _resource(cfg: TracingConfig) -> Resource:
    """The SDK's resource (OTEL_RESOURCE_ATTRIBUTES and the detectors included), its
    `service.name` from `cfg.service_name`, else OTEL_SERVICE_NAME or a service.name in
    OTEL_RESOURCE_ATTRIBUTES, else `DEFAULT_SERVICE_NAME`."""
    name = cfg.service_name
    if not name and not OTELResourceDetector().detect().attributes.get(SERVICE_NAME):
        name = DEFAULT_SERVICE_NAME
    return Resource.create({SERVICE_NAME: name} if name else None)


def _otlp_exporter(endpoint: str | None) -> SpanExporter:
    """The OTLP span exporter: OTLP/HTTP to `endpoint` (the config's); None: the one
    OpenTelemetry's environment describes, built with no arguments so that the SDK reads the
    endpoint, headers, timeout, compression and certificates itself. Its protocol is
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL: `grpc`, or
    `http/protobuf` (the default; `http/json`, which the Python SDK lacks, falls back to it)."""
    if endpoint is None:
        protocol = (os.environ.get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
                    or os.environ.get(OTEL_EXPORTER_OTLP_PROTOCOL) or "http/protobuf")
        protocol = protocol.strip().lower()
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )

            return GrpcSpanExporter()
        if protocol != "http/protobuf":
            log.warning("OTLP protocol %r is not supported: exporting over http/protobuf",
                        protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint)


def decode_attributes(
    last: GenerateChunk | None, *, kv_bytes: int, output_tokens: int, ttft_s: float | None,
    remote: bool, engine_ttft_s: float | None = None,
) -> dict[str, Any]:
    """The decode span's closing attributes: what the decode worker reported (its replica, the
    prompt tokens it had cached or received, the KV bytes its connector pulled over NIXL, its
    engine's own time to first token)."""
    attrs: dict[str, Any] = {
        PREFILL_REMOTE: remote, KV_BYTES: kv_bytes, GENAI_OUTPUT_TOKENS: output_tokens,
    }
    if last is not None:
        attrs[CACHED_TOKENS] = last.num_cached_tokens
        if last.replica:
            attrs[REPLICA] = last.replica
        if last.finish_reason:
            attrs[GENAI_FINISH_REASONS] = (last.finish_reason,)
    if ttft_s is not None:
        attrs[TTFT] = ttft_s
    if engine_ttft_s is not None:
        attrs[ENGINE_TTFT] = engine_ttft_s
    return attrs


def handoff_blocks(params: Mapping[str, Any] | None) -> int:
    """KV blocks a decode request's handoff names (`remote_block_ids`: one list per KV-cache
    group, or a flat list); 0 without a handoff."""
    blocks = (params or {}).get("remote_block_ids") or []
    first = blocks[0] if blocks else []
    return len(first) if isinstance(first, (list, tuple)) else len(blocks)


def response_id(request: GenerateRequest) -> str:
    """The `id` of the response the client gets: vLLM's server builds it from the request id
    the router gave it (`cmpl-<id>`, `chatcmpl-<id>`)."""
    if request.http is None:
        return request.request_id
    prefix = "chatcmpl" if request.http.path.endswith("/chat/completions") else "cmpl"
    return f"{prefix}-{request.request_id}"
