"""Prefix-aware routing end to end: two colocated decode replicas (one core each).

Requests sharing a long prefix must land on the replica that already holds it (read from the
`x-splitserve-replica` header and the engine's cached-token count), while an unrelated prompt
may go to either. Each engine reports its KV capacity, which bounds the router's prefix index
(`index_max_blocks: auto`).
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import ray

from splitserve.models import tiny
from tests.conftest import running_deployment, test_config

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def config():
    return test_config(
        **{
            "mode": "colocated",
            "pools.decode.replicas": 2,
            "router.routing.decode": "prefix_aware",
            "router.routing.block_size": 128,  # the CPU engine's KV block size
        }
    )


@pytest.fixture(scope="module")
def deployment(config):
    with running_deployment(config) as base:
        yield base


def _send(base: str, ids: list[int]) -> tuple[str, int]:
    r = httpx.post(
        f"{base}/v1/completions",
        json={"model": "splitserve-tiny", "prompt": ids, "max_tokens": 2},
        timeout=120,
    )
    r.raise_for_status()
    details = r.json()["usage"].get("prompt_tokens_details") or {}
    return r.headers["x-splitserve-replica"], details.get("cached_tokens", 0)


def test_shared_prefix_lands_on_the_replica_holding_it(deployment):
    rng = np.random.default_rng(5)
    for _ in range(2):  # two independent prefixes, each must stick to its replica
        prefix = rng.integers(10, 500, 640).tolist()
        home, cached = _send(deployment, prefix + [7])
        assert cached == 0
        for _ in range(6):
            replica, cached = _send(deployment, prefix + rng.integers(10, 500, 20).tolist())
            assert replica == home
            assert cached >= 512  # the whole blocks of the shared prefix came from the cache


def test_both_replicas_serve(deployment):
    rng = np.random.default_rng(9)
    seen = {_send(deployment, rng.integers(10, 500, 300).tolist())[0] for _ in range(12)}
    assert len(seen) == 2


def test_engines_report_their_kv_capacity(deployment, config):
    """What the router sizes its prefix index from: each engine's KV cache in tokens, on the
    CPU VLLM_CPU_KVCACHE_SPACE over the tiny model's bytes per token (float32 K and V)."""
    per_token = 2 * tiny.LAYERS * tiny.KV_HEADS * tiny.HEAD_DIM * 4
    expected = config.pools.decode.kv_cache_gib * (1 << 30) // per_token
    names = [e["name"] for e in ray.util.list_named_actors(all_namespaces=True)
             if e["name"].startswith("SERVE_REPLICA::splitserve#decode#")]
    assert len(names) == 2
    for name in names:
        actor = ray.get_actor(name, namespace="serve")
        stats = ray.get(actor.record_routing_stats.remote(), timeout=30)
        assert stats["kv_capacity_tokens"] == expected == 524_288
