"""The router's Prometheus metrics (one registry per router replica, served at `/metrics`).

Names follow Prometheus conventions (base units, `_total` counters, `_seconds` / `_bytes`
histograms); where vLLM has the same figure (`vllm:time_to_first_token_seconds`,
`vllm:inter_token_latency_seconds`, `vllm:request_queue_time_seconds`, ...) the meaning is
the same, measured at the router. docs/observability.md lists every metric.

Label values are bounded: `tenant` is a configured tenant name (or `default` / `unauthenticated`,
never client input), `pool` is `prefill` or `decode`, `outcome` one of `OUTCOMES`, a KV
recompute's `reason` one of `engine.messages`' KV_TRANSFER_ERROR, KV_EXPIRED.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                          0.5, 0.75, 1, 2.5, 5)

# What happened to a request (`request_log.outcome_of`): the label of `splitserve_requests_total`.
OUTCOMES = ("ok", "cancelled", "rate_limited", "client_error", "unavailable", "timeout", "error")


class RouterMetrics:
    """Request counts by outcome, latencies per tenant and per pool, token counts, and the
    dispatcher's disaggregation, KV-transfer and retry counters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "splitserve_requests",
            "Finished requests by endpoint, tenant, HTTP status and outcome (ok, cancelled, "
            "rate_limited, client_error, unavailable, timeout, error).",
            ["endpoint", "tenant", "status", "outcome"],
            registry=r,
        )
        self.in_flight = Gauge(
            "splitserve_requests_in_flight", "Requests being served.", registry=r
        )
        self.ttft = Histogram(
            "splitserve_time_to_first_token_seconds",
            "Time from the request's arrival at the router to its first token, per tenant.",
            ["tenant"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "splitserve_time_per_output_token_seconds",
            "Mean time per output token after the first, one sample per request, per tenant.",
            ["tenant"],
            buckets=_TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "splitserve_inter_token_latency_seconds",
            "Time between two streamed chunks divided by the chunk's tokens, per tenant.",
            ["tenant"],
            buckets=_TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "splitserve_e2e_request_latency_seconds",
            "End-to-end latency of completed requests (arrival to last token), per tenant.",
            ["tenant"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pool_ttft = Histogram(
            "splitserve_pool_time_to_first_token_seconds",
            "A pool's share of time to first token: prefill, from entering its gate to the "
            "handoff; decode, from entering its gate to the first token.",
            ["pool"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.engine_ttft = Histogram(
            "splitserve_engine_time_to_first_token_seconds",
            "The engine's own part of a hop's time to first token, as the worker's vLLM engine "
            "measured it (arrival in the engine to the first token's output), per pool and hop "
            "(`prefill`: a remote prefill try; `generate`: the hop that streams the tokens). "
            "The rest of `splitserve_pool_time_to_first_token_seconds` is the gate and the hops "
            "between router and worker.",
            ["pool", "hop"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.pool_tpot = Histogram(
            "splitserve_pool_time_per_output_token_seconds",
            "Mean time per output token of a request's decode hop, per pool.",
            ["pool"],
            buckets=_TOKEN_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "splitserve_prompt_tokens", "Prompt tokens of served requests.", registry=r
        )
        self.prompt_tokens_cached = Counter(
            "splitserve_prompt_tokens_cached",
            "Prompt tokens of completed requests that the decode engine did not compute (prefix "
            "cache hits or KV received from a prefill worker); ratio to prompt tokens: hit rate.",
            registry=r,
        )
        self.generation_tokens = Counter(
            "splitserve_generation_tokens", "Generated tokens.", registry=r
        )
        self._dispatch_metrics(r)

    def _dispatch_metrics(self, r: CollectorRegistry) -> None:
        """What the dispatcher counts (router/dispatch.py)."""
        self.disagg_decisions = Counter(
            "splitserve_disagg_decisions",
            "Conditional disaggregation: where prefill ran.",
            ["path"],
            registry=r,
        )
        self.kv_transfer_bytes = Histogram(
            "splitserve_kv_transfer_bytes",
            "KV-cache bytes each remote-prefill request pulled over NIXL (decode side).",
            buckets=tuple(2**k for k in range(12, 34, 2)),
            registry=r,
        )
        self.kv_transfer_duration = Histogram(
            "splitserve_kv_transfer_duration_seconds",
            "Per remote-prefill request: how long its KV pull over NIXL took, as the decode "
            "worker's connector measured it (post to completion).",
            buckets=(0.0005, 0.001, 0.0025) + _LATENCY_BUCKETS,
            registry=r,
        )
        self.kv_recomputes = Counter(
            "splitserve_kv_recomputes",
            "Remote-prefill requests whose KV the decode worker recomputed instead of pulling, "
            "by reason: transfer_error (the NIXL pull failed: transfer error, failed handshake, "
            "peer gone) or expired (the handoff's fetch deadline passed first).",
            ["reason"],
            registry=r,
        )
        self.disagg_reasons = Counter(
            "splitserve_disagg_reasons",
            "Disaggregation decisions by path: remote (prefill pool, KV handoff), local (whole on "
            "decode), offload (whole on prefill), multi_sequence (several prompts or prompt "
            "logprobs: whole on decode).",
            ["reason"],
            registry=r,
        )
        self.ttft_prediction = Histogram(
            "splitserve_ttft_prediction_ratio",
            "Measured over predicted time to first token of the disaggregation rule's decisions, "
            "by path (1: exact).",
            ["path"],
            buckets=(0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0),
            registry=r,
        )
        self.stream_intervals = Counter(
            "splitserve_stream_intervals",
            "Requests by the most tokens per streamed chunk the router asked of the engine "
            "(adaptive coalescing under load, router.streaming; 1: every token at once).",
            ["tokens_per_chunk"],
            registry=r,
        )
        self.decode_migrations = Counter(
            "splitserve_decode_migrations",
            "Requests continued on another decode replica after theirs failed, by failure kind.",
            ["reason"],
            registry=r,
        )
        self.decode_room_waits = Counter(
            "splitserve_decode_room_waits",
            "Remote-prefill requests that waited, before prefilling, for a decode replica with a "
            "slot and KV room (decode first).",
            registry=r,
        )
        self.decode_pin_misses = Counter(
            "splitserve_decode_pin_misses",
            "Decode requests that ran on another replica than the one reserved for them (it was "
            "gone or full when they were routed).",
            registry=r,
        )
        self.prefill_fallbacks = Counter(
            "splitserve_prefill_fallbacks",
            "Remote prefills that failed and were redone on the decode worker.",
            registry=r,
        )
        self.prefill_retries = Counter(
            "splitserve_prefill_retries",
            "Remote prefills tried again (on another replica) after a failed try.",
            registry=r,
        )
        self.prefill_failures = Counter(
            "splitserve_prefill_failures",
            "Failed remote-prefill tries by reason: replica, timeout, handoff, overload.",
            ["reason"],
            registry=r,
        )

    def observe_request(self, endpoint: str, status: int, *, tenant: str, outcome: str) -> None:
        """Count a finished request (any outcome; once per request)."""
        self.requests.labels(
            endpoint=endpoint, tenant=tenant, status=str(status), outcome=outcome
        ).inc()

    def observe_generation(
        self, *, tenant: str, ttft: float | None, e2e: float, prompt_tokens: int,
        output_tokens: int, cached_tokens: int = 0,
    ) -> None:
        """Latency and token figures of one completed generation (times in seconds)."""
        if ttft is not None:
            self.ttft.labels(tenant=tenant).observe(ttft)
            if output_tokens > 1:
                self.tpot.labels(tenant=tenant).observe((e2e - ttft) / (output_tokens - 1))
        self.e2e.labels(tenant=tenant).observe(e2e)
        self.prompt_tokens.inc(prompt_tokens)
        self.prompt_tokens_cached.inc(min(cached_tokens, prompt_tokens))
        self.generation_tokens.inc(output_tokens)

    def observe_gap(self, tenant: str, seconds: float, tokens: int) -> None:
        """A streamed chunk of `tokens` tokens arrived `seconds` after the previous one."""
        if tokens > 0:
            self.itl.labels(tenant=tenant).observe(seconds / tokens)

    # SignalRecorder's observer interface (router/signals.py): the per-pool latencies.

    def pool_first_token(self, pool: str, seconds: float) -> None:
        """A pool's share of one request's time to first token."""
        self.pool_ttft.labels(pool=pool).observe(seconds)

    def pool_finished(self, pool: str, first_to_last_s: float, output_tokens: int) -> None:
        """A request's hop in `pool` finished (no sample for fewer than 2 tokens)."""
        if output_tokens >= 2:
            self.pool_tpot.labels(pool=pool).observe(first_to_last_s / (output_tokens - 1))

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)
