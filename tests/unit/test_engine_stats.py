"""LatestStats: accumulating vLLM's per-step NIXL connector stats into running totals."""

from __future__ import annotations

import pytest

from splitserve.engine.stats import LatestStats


def _step(durations: list[float], sizes: list[int], **failures: list[int]) -> dict:
    """One step's connector stats, shaped like `NixlKVConnectorStats.data`."""
    return {
        "transfer_duration": durations,
        "post_duration": [d / 10 for d in durations],
        "bytes_transferred": sizes,
        "num_descriptors": [8] * len(sizes),
        **failures,
    }


def test_connector_stats_accumulate_over_steps():
    stats = LatestStats()
    stats.add_connector_stats(_step([0.002, 0.003], [4096, 8192]))
    stats.add_connector_stats({})  # a step without transfers
    stats.add_connector_stats(_step([0.005], [1024], num_failed_transfers=[1]))
    snap = stats.snapshot(role="decode", replica="r0", num_unfinished=0)
    assert snap.kv_transfers == 3
    assert snap.kv_bytes_received == 4096 + 8192 + 1024
    assert snap.kv_transfer_seconds == pytest.approx(0.010)
    assert snap.kv_transfer_failures == 1


def test_fresh_snapshot_has_no_transfers():
    snap = LatestStats().snapshot(role="prefill", replica="r1", num_unfinished=2)
    assert (snap.kv_transfers, snap.kv_bytes_received, snap.kv_transfer_seconds) == (0, 0, 0.0)
    assert (snap.role, snap.replica, snap.num_unfinished) == ("prefill", "r1", 2)


def test_snapshot_carries_the_engines_kv_capacity():
    from types import SimpleNamespace

    from splitserve.engine.host import kv_capacity_tokens

    assert LatestStats().snapshot(role="decode", replica="r", num_unfinished=0) \
        .kv_capacity_tokens == 0  # unknown
    vllm_config = SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=4096,
                                                               block_size=128))
    tokens = kv_capacity_tokens(vllm_config)
    assert tokens == 524_288
    snap = LatestStats().snapshot(role="decode", replica="r", num_unfinished=0,
                                  kv_capacity_tokens=tokens)
    assert snap.kv_capacity_tokens == 524_288
    # before the engine has allocated its cache vLLM leaves num_gpu_blocks unset
    unset = SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=None, block_size=128))
    assert kv_capacity_tokens(unset) == 0


def test_first_token_latency_is_read_from_vllms_request_stats():
    """The engine's own TTFT that a worker sends with its first chunk (vLLM's RequestStateStats
    of a real `RequestOutput`); None where the engine keeps no request stats."""
    from types import SimpleNamespace

    from vllm.v1.metrics.stats import RequestStateStats

    from splitserve.engine.vllm_server import first_token_latency

    stats = RequestStateStats(arrival_time=100.0)
    assert first_token_latency(SimpleNamespace(metrics=stats)) is None  # no first token yet
    stats.first_token_latency = 0.125
    assert first_token_latency(SimpleNamespace(metrics=stats)) == 0.125
    assert first_token_latency(SimpleNamespace(metrics=None)) is None
