"""Engines publish vLLM's KV events when `router.routing.kv_events` is on (the default): the
engine arguments carry a `KVEventsConfig` that vLLM accepts, binding a port the OS picks; off,
none; the kv_events policy needs them on (a config error otherwise)."""

from __future__ import annotations

import pytest
from vllm.config import KVEventsConfig

from splitserve.config import ConfigError, parse_config
from splitserve.engine.args import engine_kwargs, engine_spec


def _spec(routing: dict | None = None, role: str = "decode"):
    cfg = parse_config({"mode": "disaggregated", "router": {"routing": routing or {}}})
    return engine_spec(cfg, role, "cpu")  # type: ignore[arg-type]


def test_engines_publish_kv_events_by_default() -> None:
    for role in ("prefill", "decode"):
        spec = _spec(role=role)
        assert spec.kv_events
        events = KVEventsConfig(**engine_kwargs(spec, "/m")["kv_events_config"])
        assert events.enable_kv_cache_events and events.publisher == "zmq"
        # a wildcard bind on port 0: vLLM binds VLLM_HOST_IP on a free port and reports it
        assert events.endpoint == "tcp://*:0" and events.replay_endpoint == "tcp://*:0"


def test_kv_events_off_publishes_nothing() -> None:
    spec = _spec({"kv_events": False, "prefill": "prefix_aware", "decode": "round_robin"})
    assert not spec.kv_events
    assert "kv_events_config" not in engine_kwargs(spec, "/m")


def test_the_kv_events_policy_needs_the_events() -> None:
    with pytest.raises(ConfigError, match="kv_events"):
        _spec({"kv_events": False})  # the default policies are kv_events
