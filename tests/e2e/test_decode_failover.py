"""A decode replica killed mid-stream: its requests continue on the other replica, and every
client stream ends with exactly the tokens an undisturbed run gives (issue 8, decode failure).

One colocated deployment with two decode replicas, one core each. STREAMS concurrent greedy
streams run; once a quarter of their tokens has arrived, one replica's Serve actor is killed.
The router continues each of its requests on the survivor as prompt + the tokens already streamed
(`router/retry.py` `continuation`). Afterwards Serve has replaced the replica, and no replica holds
a request or a KV block.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import openai
import pytest
import ray

from tests.conftest import (
    direct_greedy,
    running_deployment,
    stream_token_ids,
    test_config,
    wait_healthy,
)

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
STREAMS = 32
MAX_TOKENS = 64
DEADLINE_S = 600


@pytest.fixture(scope="module")
def deployment():
    cfg = test_config(**{"mode": "colocated", "pools.decode.replicas": 2})
    with running_deployment(cfg) as base:
        yield base


def _replicas() -> list[str]:
    return sorted(
        e["name"] for e in ray.util.list_named_actors(all_namespaces=True)
        if e["name"].startswith("SERVE_REPLICA::splitserve#decode#")
    )


def _loads() -> dict[str, tuple[int, float]]:
    out = {}
    for name in _replicas():
        try:
            stats = ray.get(ray.get_actor(name, namespace="serve").record_routing_stats.remote(),
                            timeout=30)
        except (ray.exceptions.RayError, ValueError):
            continue  # the killed replica, or its replacement still starting
        out[name] = (stats["num_unfinished"], stats["kv_cache_usage"])
    return out


def _migrations(base: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith('splitserve_decode_migrations_total{reason="replica"} '):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_killing_a_decode_replica_mid_stream_changes_no_token(deployment):
    rng = np.random.default_rng(8)
    prompts = [rng.integers(10, 500, int(rng.integers(40, 200))).tolist() for _ in range(STREAMS)]
    reference = [direct_greedy(ids, MAX_TOKENS) for ids in prompts]
    victims = _replicas()
    assert len(victims) == 2
    before = _migrations(deployment)
    received = [0]

    def count(new: list[int]) -> None:
        received[0] += len(new)

    async def main():
        async with openai.AsyncOpenAI(
            base_url=f"{deployment}/v1", api_key="x", max_retries=0, timeout=DEADLINE_S
        ) as client:
            tasks = [asyncio.create_task(stream_token_ids(client, ids, MAX_TOKENS, on_tokens=count))
                     for ids in prompts]
            while received[0] < STREAMS * MAX_TOKENS // 4:
                assert not any(t.done() and t.exception() for t in tasks)
                await asyncio.sleep(0.05)
            ray.kill(ray.get_actor(victims[0], namespace="serve"), no_restart=True)
            at_kill = received[0]
            return await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S), at_kill

    outputs, at_kill = asyncio.run(main())
    assert at_kill < sum(map(len, reference))  # the kill came while streams were running
    mismatched = [i for i, (o, r) in enumerate(zip(outputs, reference, strict=True)) if o != r]
    assert not mismatched, f"{len(mismatched)} of {STREAMS} streams differ from the reference"
    assert _migrations(deployment) > before  # some streams really were on the killed replica

    # Serve notices the death, starts a replacement, and both replicas end idle. (Right after
    # the kill Serve may still count the dead replica as running: wait for the replacement.)
    deadline = time.monotonic() + 600
    loads: dict[str, tuple[int, float]] = {}
    while time.monotonic() < deadline:
        loads = _loads()
        if victims[0] not in loads and len(loads) == 2 and set(loads.values()) == {(0, 0.0)}:
            break
        time.sleep(2)
    assert victims[0] not in _replicas()
    assert loads == {name: (0, 0.0) for name in loads} and len(loads) == 2, loads
    wait_healthy(deployment)
