"""The engine metrics splitserve relies on: vLLM's own, exported through Ray's metrics agent.

With `observability.engine_metrics` on, each engine adds vLLM's `RayPrometheusStatLogger` (as
Ray Serve LLM does): its metrics keep vLLM's names and meaning, and Ray's metrics endpoint on
every node (port 8080 in the Helm chart) serves them as `ray_` + the name with `:` made `_`,
labelled by `ReplicaId` (the Serve replica), `model_name` and `engine`. `ENGINE_METRICS` lists
the ones the Grafana dashboard and docs/observability.md use; tests check each against vLLM.
"""

from __future__ import annotations

import re
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]

ENGINE_METRICS: dict[str, Kind] = {
    "vllm:num_requests_running": "gauge",  # requests in the engine's running batch
    "vllm:num_requests_waiting": "gauge",  # requests waiting in the engine's scheduler
    "vllm:kv_cache_usage_perc": "gauge",  # fraction of KV blocks in use (0 to 1)
    "vllm:prefix_cache_queries": "counter",  # prompt tokens looked up in the prefix cache
    "vllm:prefix_cache_hits": "counter",  # ... of which were cached
    "vllm:nixl_xfer_time_seconds": "histogram",  # NIXL KV transfer duration (decode side)
    "vllm:nixl_bytes_transferred": "histogram",  # bytes per NIXL KV transfer
}

_SUFFIXES: dict[Kind, tuple[str, ...]] = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
}


def ray_name(vllm_name: str) -> str:
    """The name Ray's metrics endpoint gives a vLLM metric (`vllm:x` -> `ray_vllm_x`)."""
    return "ray_" + re.sub(r"[^a-zA-Z0-9_]", "_", vllm_name)


def exported_sample_names() -> set[str]:
    """Every sample name the engines export for `ENGINE_METRICS` (with `_total`, `_bucket`...)."""
    return {ray_name(n) + s for n, kind in ENGINE_METRICS.items() for s in _SUFFIXES[kind]}
