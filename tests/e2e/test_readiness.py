"""Readiness while the prefill pool is short (issue 25, point 5): a prefill replica killed under
a small load; every request completes (the router prefills on the decode pool meanwhile), and
`/health` and `/health/ready` stay 200 throughout, `degraded` while the pool is short and `ok`
again once Serve has replaced the replica. `/health/live` answers 200 all along, and no body
carries anything but short words.

One disaggregated deployment of its own (one prefill and one decode replica, one core each);
LOAD_WORKERS clients send short non-streamed completions one after another, so that at most
that many requests are in flight on two shared cores.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest
import ray

from tests.conftest import running_deployment, test_config, wait_healthy

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
LOAD_WORKERS = 3
MAX_TOKENS = 4
RECOVERY_S = 420  # the killed replica is replaced (a fresh engine on shared cores) within this
WORDS = {"ok", "degraded", "unavailable", "timeout"}


@pytest.fixture(scope="module")
def deployment():
    cfg = test_config(
        **{
            "mode": "disaggregated",
            "disaggregation.min_remote_prompt_tokens": 128,  # every prompt here prefills remotely
            "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
            "disaggregation.prefill_timeout_s": 10,  # a request waits this long, then local
            # a ping's bound: generous, so that a decode replica slowed by the shared cores
            # (the replacement engine loading beside it) does not read as down
            "router.health_timeout_s": 10,
        }
    )
    with running_deployment(cfg) as base:
        yield base


def _metric(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _prefill_replicas() -> list[str]:
    return sorted(
        e["name"] for e in ray.util.list_named_actors(all_namespaces=True)
        if e["name"].startswith("SERVE_REPLICA::splitserve#prefill#")
    )


def _words(body: dict) -> set[str]:
    return {body["status"], *body["pools"].values(), *body["models"].values()}


def test_killing_the_prefill_replica_keeps_the_router_ready(deployment):
    rng = np.random.default_rng(25)
    prompts = [rng.integers(10, 500, int(rng.integers(150, 260))).tolist() for _ in range(64)]
    (victim,) = _prefill_replicas()
    fallbacks = _metric(deployment, "splitserve_prefill_fallbacks_total")
    results: list[tuple[float, float, int, str | None]] = []  # start, end, HTTP status, finish
    polls: list[tuple[float, str, int, dict]] = []  # time, path, status, body
    stop = asyncio.Event()
    marks: dict[str, float] = {}

    async def load(client: httpx.AsyncClient, worker: int) -> None:
        i = worker
        while not stop.is_set():
            start = time.monotonic()
            r = await client.post("/v1/completions", json={
                "model": MODEL, "prompt": prompts[i % len(prompts)], "max_tokens": MAX_TOKENS,
                "temperature": 0})
            finish = r.json()["choices"][0]["finish_reason"] if r.status_code == 200 else None
            results.append((start, time.monotonic(), r.status_code, finish))
            i += LOAD_WORKERS

    async def watch(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            for path in ("/health", "/health/ready", "/health/live"):
                r = await client.get(path)
                polls.append((time.monotonic(), path, r.status_code, r.json()))
            await asyncio.sleep(0.5)

    async def main() -> None:
        async with httpx.AsyncClient(base_url=deployment, timeout=120) as client:
            tasks = [asyncio.create_task(load(client, w)) for w in range(LOAD_WORKERS)]
            tasks.append(asyncio.create_task(watch(client)))
            while len(results) < LOAD_WORKERS:  # the load runs
                assert not any(t.done() for t in tasks), [t.exception() for t in tasks]
                await asyncio.sleep(0.2)
            marks["kill"] = time.monotonic()
            await asyncio.to_thread(
                ray.kill, ray.get_actor(victim, namespace="serve"), no_restart=True)
            deadline = marks["kill"] + RECOVERY_S
            while time.monotonic() < deadline:
                assert not any(t.done() for t in tasks), [t.exception() for t in tasks]
                after = [p for p in polls if p[0] > marks["kill"] and p[1] == "/health"]
                degraded = [p for p in after if p[3]["status"] == "degraded"]
                if degraded and "degraded" not in marks:
                    marks["degraded"] = degraded[0][0]
                back = [p for p in after if "degraded" in marks and p[0] > marks["degraded"]
                        and p[3]["status"] == "ok"]
                if back:
                    marks["ok"] = back[0][0]
                    break
                await asyncio.sleep(0.5)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 300)

    asyncio.run(main())

    # every request completed, before, during and after the outage
    assert results and all(status == 200 and finish in ("length", "stop")
                           for _, _, status, finish in results), results
    # ready throughout: never a 503, and only short words in the bodies
    assert all(code == 200 for _, _, code, _ in polls), [p for p in polls if p[2] != 200]
    for _, path, _, body in polls:
        if path == "/health/live":
            assert body == {"status": "ok"}
        else:
            assert _words(body) <= WORDS, body
    # degraded while the prefill pool was short, with the decode pool answering
    assert "degraded" in marks, [p[3] for p in polls if p[1] == "/health"][-5:]
    short = [p[3] for p in polls if p[3].get("status") == "degraded"]
    assert all(b["pools"]["decode"] == "ok" and b["pools"]["prefill"] in ("timeout", "unavailable")
               for b in short), short
    ready = [p for p in polls if p[1] == "/health/ready" and p[0] > marks["degraded"]]
    assert any(p[3]["status"] == "degraded" for p in ready)
    # requests that arrived while the pool was short completed: the decode pool prefilled them
    assert any(marks["degraded"] <= start < marks.get("ok", float("inf"))
               for start, _, _, _ in results)
    assert _metric(deployment, "splitserve_prefill_fallbacks_total") > fallbacks
    # Serve replaced the replica: the router is `ok` again
    assert "ok" in marks, f"prefill pool not back within {RECOVERY_S}s"
    assert victim not in _prefill_replicas()
    wait_healthy(deployment, timeout_s=60)
