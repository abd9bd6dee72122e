"""What the router records about each request once it is over: its metrics and its log line.

    obs = RequestObserver(metrics, endpoint, headers, log_request=True, log_prompt=False)
    obs.describe(tenant=tenant)                        after authentication
    obs.describe(request=gen_req, stream=..., prompt=...)   after preparation
    chunks = obs.stream(chunks)                         counts tokens, first token, gaps
    obs.answered(status, error)                         the handler is done (exactly once)

With direct streaming (router/direct.py) no chunk crosses the router: the request is described
the same way when HAProxy asks for its route, and `obs.settled(settlement)` (instead of
`answered`) takes its figures from the replica's settlement when the response has ended.

The request is over when the handler has answered and the chunk stream it wrapped, if any, is
closed (a streamed response outlives its handler), like the tracing root span
(router/tracing.py). Then, once: `splitserve_requests_total{outcome}`, the latency and token
figures of a completed request, and one INFO line on the `splitserve.requests` logger with
`REQUEST_FIELDS`. The prompt text is added only when `log_prompt` is set (config
`observability.log_prompts`); it is never logged otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from splitserve.logs import FIELDS
from splitserve.engine.routed import SETTLEMENT_LOST
from splitserve.router.tenancy.tenants import UNAUTHENTICATED
from splitserve.router.request_end import RequestEnd

if TYPE_CHECKING:
    from splitserve.engine.messages import GenerateChunk, GenerateRequest
    from splitserve.engine.routed import Settlement
    from splitserve.router.metrics import RouterMetrics

log = logging.getLogger("splitserve.requests")

# The request log line's fields, in order (docs/observability.md).
REQUEST_FIELDS = (
    "trace_id", "request_id", "endpoint", "tenant", "stream", "status", "outcome", "error",
    "prompt_tokens", "cached_tokens", "output_tokens", "max_tokens", "finish_reason", "replica",
    "kv_recomputed", "ttft_s", "e2e_s",
)
# The status of a request whose client left before the handler answered (nginx's convention).
CLIENT_CLOSED = 499
_PROPAGATOR = TraceContextTextMapPropagator()


def outcome_of(status: int, *, cancelled: bool = False, stream_status: int | None = None) -> str:
    """The request's outcome label (`metrics.OUTCOMES`) from its HTTP status; a client that
    left first is `cancelled`; a stream that failed after its 200 went out takes the status of
    its error event (`stream_status`)."""
    if cancelled:
        return "cancelled"
    if status == 200 and stream_status is not None:
        status = stream_status
    if status < 400:
        return "ok"
    if status == 429:
        return "rate_limited"
    if status < 500:
        return "client_error"
    return {503: "unavailable", 504: "timeout"}.get(status, "error")


def trace_id_of(context: Context | None, headers: Mapping[str, str]) -> str | None:
    """The request's trace id (32 hex digits): its root span's when tracing made one (also when
    sampled out), else the caller's W3C `traceparent`, else None."""
    for ctx in (context, _PROPAGATOR.extract(headers) if "traceparent" in headers else None):
        if ctx is None:
            continue
        span_context = trace.get_current_span(ctx).get_span_context()
        if span_context.is_valid:
            return trace.format_trace_id(span_context.trace_id)
    return None


class RequestObserver(RequestEnd):
    """One request's figures until it is over; then its metrics and log line (see module doc).

    Single event loop, like the rest of the request path. `clock`: seconds, monotonic."""

    def __init__(
        self, metrics: RouterMetrics, endpoint: str, *, trace_id: str | None = None,
        log_request: bool = True, log_prompt: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.metrics = metrics
        self.clock = clock
        self.log_request = log_request
        self.log_prompt = log_prompt
        self.start = clock()
        self.fields: dict[str, Any] = dict.fromkeys(REQUEST_FIELDS)
        self.fields.update(
            trace_id=trace_id, endpoint=endpoint, tenant=UNAUTHENTICATED, prompt_tokens=0,
            cached_tokens=0, output_tokens=0,
        )
        super().__init__()
        self._stream_status: int | None = None
        self._last_chunk_at: float | None = None

    def describe(
        self, *, tenant: str | None = None, request: GenerateRequest | None = None,
        stream: bool | None = None, prompt: Any = None,
    ) -> None:
        """Record what the router learnt: the tenant's name, then the prepared request (and its
        prompt text, kept only when `log_prompt`)."""
        if tenant is not None:
            self.fields["tenant"] = tenant
        if request is not None:
            self.fields["request_id"] = request.request_id
            self.fields["prompt_tokens"] = len(request.prompt_token_ids)
            self.fields["max_tokens"] = request.sampling.max_tokens
        if stream is not None:
            self.fields["stream"] = stream
        if prompt is not None and self.log_prompt:
            self.fields["prompt"] = prompt

    def _on_stream_error(self, err: BaseException) -> None:
        self._stream_status = getattr(err, "status", 500)
        self.fields["error"] = _error_name(err)

    def _on_chunk(self, chunk: GenerateChunk) -> None:
        f, now = self.fields, self.clock()
        n = len(chunk.token_ids)
        if n:
            if f["ttft_s"] is None:
                f["ttft_s"] = now - self.start
            elif self._last_chunk_at is not None:
                self.metrics.observe_gap(f["tenant"], now - self._last_chunk_at, n)
            self._last_chunk_at = now
        f["output_tokens"] += n
        f["replica"] = f["replica"] or chunk.replica or None
        if chunk.finish_reason is not None:
            f["finish_reason"] = chunk.finish_reason
            f["cached_tokens"] = chunk.num_cached_tokens
        if chunk.kv_recomputed is not None:  # the handoff's KV was not pulled (why)
            f["kv_recomputed"] = chunk.kv_recomputed

    def answered(self, status: int, error: BaseException | None = None) -> None:
        """The handler is done: `status` sent (or `error` raised). Call exactly once."""
        if isinstance(error, asyncio.CancelledError):  # the handler was cancelled: no response
            self._cancelled = True
            status = CLIENT_CLOSED
        self.fields["status"] = status
        if error is not None and self.fields["error"] is None:
            self.fields["error"] = _error_name(error)
        self._release()

    def settled(self, settlement: Settlement | None, replica: str | None = None) -> None:
        """A directly served request is over (call instead of `answered`): its figures from
        the `settlement` its replica (`replica`) sent, or, None, from nothing (the replica was
        lost; `SETTLEMENT_LOST`). The time to first token is the router's: from the route to
        the settlement, less the replica's decode time. A request the replica handed back to
        the router (not generated, not refused) is recorded there, not here."""
        f = self.fields
        f["replica"] = replica
        if settlement is None:
            f["error"] = "settlement_lost"
            self.answered(SETTLEMENT_LOST)
            return
        if settlement.handed_back:
            return
        f["prompt_tokens"] = settlement.prompt_tokens or f["prompt_tokens"]
        f["output_tokens"] = settlement.output_tokens
        f["cached_tokens"] = settlement.cached_tokens
        f["finish_reason"] = settlement.finish_reason
        if settlement.first_token_s is not None:
            f["ttft_s"] = max(0.0, self.clock() - self.start - (settlement.decode_s or 0.0))
        self._cancelled = settlement.cancelled
        self.answered(settlement.status)

    def _end(self) -> None:
        f = self.fields
        f["e2e_s"] = self.clock() - self.start
        f["outcome"] = outcome_of(
            f["status"], cancelled=self._cancelled, stream_status=self._stream_status
        )
        self.metrics.observe_request(
            f["endpoint"], f["status"], tenant=f["tenant"], outcome=f["outcome"]
        )
        if f["outcome"] == "ok":
            self.metrics.observe_generation(
                tenant=f["tenant"], ttft=f["ttft_s"], e2e=f["e2e_s"],
                prompt_tokens=f["prompt_tokens"], output_tokens=f["output_tokens"],
                cached_tokens=f["cached_tokens"],
            )
        if self.log_request:
            log.info("request %s %s", f["outcome"], f["request_id"] or "-",
                     extra={FIELDS: dict(f)})


def _error_name(err: BaseException) -> str:
    """A short, bounded error name: an API error's code, else the exception's class."""
    code = getattr(err, "code", None) or getattr(err, "reason", None)
    return code if isinstance(code, str) and code else type(err).__name__
