"""Keeps the latest scheduler statistics of an engine, through vLLM's stat-logger hook."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from splitserve.engine.kv_telemetry import (
    REQUEST_FAILURES,
    REQUEST_TRANSFERS,
    external_request_id,
)
from splitserve.engine.messages import EngineStats, StepCost
from splitserve.engine.step_cost import StepTimer

# Requests whose measured KV transfer is kept until their host collects it. A request's entry is
# collected when it finishes; this bound only drops entries of requests nobody collects (aborted
# or failed ones), oldest first.
MAX_REQUEST_TRANSFERS = 4096


@dataclass
class RequestTransfer:
    """The measured KV transfer(s) of one request (one per remote rank, running concurrently),
    and whether its KV load failed (the engine recomputed the prompt)."""

    seconds: float = 0.0  # the longest transfer's post-to-completion time
    bytes: int = 0  # summed over its transfers
    transfers: int = 0
    failed: bool = False


def connector_parts(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """One step's KV connector stats, one dict per connector: vLLM's MultiConnector (NIXL with
    the KV tier) reports `{connector class name: its stats}`, a single connector its own dict.

    >>> connector_parts({"NixlConnector": {"transfer_duration": [0.1]}, "OffloadingConnector": {}})
    [{'transfer_duration': [0.1]}, {}]
    >>> connector_parts({"transfer_duration": [0.1]})
    [{'transfer_duration': [0.1]}]
    """
    if stats and all(k.endswith("Connector") and isinstance(v, dict) for k, v in stats.items()):
        return list(stats.values())
    return [stats]


class LatestStats:
    """Holds the most recent `SchedulerStats` and running prefix-cache totals.

    `factory` is passed to `AsyncLLM(stat_loggers=[...])`; vLLM calls the logger it builds
    after every engine step, in the engine's output-handler task (never concurrently).
    """

    def __init__(self) -> None:
        self.scheduler: Any = None
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.kv_transfers = 0
        self.kv_bytes = 0
        self.kv_seconds = 0.0
        self.kv_failures = 0
        self.kv_handoffs_expired = 0  # counted by the host: handoffs recomputed, never pulled
        self.kv_loaded: dict[str, int] = {}  # prompt tokens a connector supplied, by source
        self.requests: OrderedDict[str, RequestTransfer] = OrderedDict()
        self.steps = StepTimer()  # fed by vLLM's iteration details (engine arg on)

    def factory(self, vllm_config: Any, engine_index: int = 0):
        """A vLLM `StatLoggerFactory` bound to this holder."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        holder = self

        class _Logger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
                if scheduler_stats is None:
                    return
                holder.scheduler = scheduler_stats
                details = scheduler_stats.iteration_details
                if details is not None and not details.is_dummy:
                    holder.steps.observe(
                        details.iteration_index, details.num_generation_requests,
                        details.num_ctx_tokens, details.elapsed_ms / 1e3,
                        arrived_s=time.monotonic(),
                        busy_after=scheduler_stats.num_running_reqs
                        + scheduler_stats.num_waiting_reqs > 0,
                        prefill_requests=details.num_ctx_requests,
                    )
                pcs = scheduler_stats.prefix_cache_stats
                holder.prefix_queries += getattr(pcs, "queries", 0)
                holder.prefix_hits += getattr(pcs, "hits", 0)
                holder.add_loaded(scheduler_stats.connector_prefix_cache_stats)
                for part in connector_parts(scheduler_stats.kv_connector_stats or {}):
                    holder.add_connector_stats(part)

            def log_engine_initialized(self) -> None:
                pass

        return _Logger(vllm_config, engine_index)

    def add_loaded(self, connector_cache: Any) -> None:
        """Count one step's prompt tokens that a connector supplied, by vLLM's source (its
        connector prefix-cache stats; None without a connector)."""
        for source, tokens in getattr(connector_cache, "hits_by_source", {}).items():
            key = getattr(source, "value", str(source))
            self.kv_loaded[key] = self.kv_loaded.get(key, 0) + int(tokens)

    def add_connector_stats(self, stats: dict[str, Any]) -> None:
        """Accumulate one step's NIXL connector stats (vLLM resets them every step)."""
        self.kv_transfers += len(stats.get("transfer_duration", ()))
        self.kv_bytes += int(sum(stats.get("bytes_transferred", ())))
        self.kv_seconds += float(sum(stats.get("transfer_duration", ())))
        for key in ("num_failed_transfers", "num_failed_handshakes", "num_kv_expired_reqs"):
            self.kv_failures += len(stats.get(key, ()))
        for req_id, seconds, n_bytes in stats.get(REQUEST_TRANSFERS, ()):
            entry = self._request(external_request_id(req_id))
            entry.seconds = max(entry.seconds, float(seconds))
            entry.bytes += int(n_bytes)
            entry.transfers += 1
        for req_id in stats.get(REQUEST_FAILURES, ()):
            self._request(external_request_id(req_id)).failed = True

    def _request(self, request_id: str) -> RequestTransfer:
        entry = self.requests.get(request_id)
        if entry is None:
            entry = self.requests[request_id] = RequestTransfer()
            while len(self.requests) > MAX_REQUEST_TRANSFERS:
                self.requests.popitem(last=False)
        return entry

    def step_cost(self, chunk_tokens: int) -> StepCost | None:
        """The engine's fitted step cost (None before its first timed step)."""
        step_s, per_seq_s, per_token_s = self.steps.coefficients()
        if not step_s and per_seq_s is None and per_token_s is None:
            return None
        return StepCost(step_s, per_seq_s, per_token_s, chunk_tokens)

    def pop_request_transfer(self, request_id: str) -> RequestTransfer | None:
        """The measured KV transfer of `request_id` (the caller's id), once; None when the
        connector reported neither a transfer nor a failed load (local prefill, telemetry off,
        or not in yet)."""
        return self.requests.pop(request_id, None)

    def snapshot(
        self, *, role: str, replica: str, num_unfinished: int, kv_capacity_tokens: int = 0
    ) -> EngineStats:
        """An `EngineStats` from the latest step (`kv_capacity_tokens`: the host's figure)."""
        s = self.scheduler
        return EngineStats(
            role=role,
            replica=replica,
            num_running=s.num_running_reqs if s else 0,
            num_waiting=s.num_waiting_reqs if s else 0,
            num_unfinished=num_unfinished,
            kv_cache_usage=s.kv_cache_usage if s else 0.0,
            prefix_cache_queries=self.prefix_queries,
            prefix_cache_hits=self.prefix_hits,
            kv_transfers=self.kv_transfers,
            kv_bytes_received=self.kv_bytes,
            kv_transfer_seconds=self.kv_seconds,
            kv_transfer_failures=self.kv_failures,
            kv_handoffs_expired=self.kv_handoffs_expired,
            kv_capacity_tokens=kv_capacity_tokens,
            kv_loaded_tokens=dict(self.kv_loaded),
        )
