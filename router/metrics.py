"""The router's Prometheus metrics (one registry per router replica)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class RouterMetrics:
    """Request counts, latencies and token counts, labelled by endpoint and outcome."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "splitserve_requests",
            "Requests by endpoint and HTTP status.",
            ["endpoint", "status"],
            registry=r,
        )
        self.in_flight = Gauge(
            "splitserve_requests_in_flight", "Requests being served.", registry=r
        )
        self.ttft = Histogram(
            "splitserve_time_to_first_token_seconds",
            "Time to first token.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "splitserve_time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "splitserve_e2e_request_latency_seconds",
            "End-to-end request latency.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "splitserve_prompt_tokens", "Prompt tokens of served requests.", registry=r
        )
        self.generation_tokens = Counter(
            "splitserve_generation_tokens", "Generated tokens.", registry=r
        )

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
        self.disagg_reasons = Counter(
            "splitserve_disagg_reasons",
            "Conditional disaggregation decisions by reason: remote, or local because the prompt "
            "was short, the prefill queue full, or the prefill pool more backed up (spill), or the "
            "whole request on a prefill replica because decode was the bottleneck (offload).",
            ["reason"],
            registry=r,
        )
        self.decode_migrations = Counter(
            "splitserve_decode_migrations",
            "Requests continued on another decode replica after theirs failed, by failure kind.",
            ["reason"],
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

    def observe_request(self, endpoint: str, status: int) -> None:
        """Count a finished request (any outcome)."""
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def observe_generation(
        self, *, ttft: float | None, e2e: float, prompt_tokens: int, output_tokens: int
    ) -> None:
        """Latency and token figures of one completed generation."""
        if ttft is not None:
            self.ttft.observe(ttft)
            if output_tokens > 1:
                self.tpot.observe((e2e - ttft) / (output_tokens - 1))
        self.e2e.observe(e2e)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(output_tokens)

    def render(self) -> bytes:
        """Prometheus text exposition."""
        return generate_latest(self.registry)
