"""The dispatcher's view of the pools' prefix caches comes from the engines' KV events: the
pool's `KVEventFeed` in this process (the same one its request router keeps subscribed). It
hashes each prompt once, with vLLM's function in the engines' block size, and hands the hashes
to the pools' request routers on the request (`prompt_blocks`). Fake pool handles, no Ray."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

from router_fakes import HANDOFF, Pool
from splitserve.router.dispatch import Dispatcher
from splitserve.router.metrics import RouterMetrics
from splitserve.router.routing.kv_feed import pool_feed
from splitserve.router.routing.vllm_hash import PromptHasher
from splitserve.router.tenancy import DEFAULT_TENANT, Tenancy

from splitserve.config import parse_config
from splitserve.engine.messages import GenerateChunk, GenerateRequest, Sampling, StepCost

BLOCK = 16
COST = StepCost(0.001, 0.001, 1e-4, 2048)  # as in test_dispatch_load


def _pool(app: str, name: str, *outcomes) -> Pool:
    pool = Pool(*outcomes)
    pool.deployment_id = SimpleNamespace(app_name=app, name=name)  # as a DeploymentHandle has
    return pool


def _setup(app: str, **disagg):
    cfg = parse_config({"mode": "disaggregated", "disaggregation": disagg})
    prefill = _pool(app, "prefill", [GenerateChunk((7,), "", kv_transfer_params=HANDOFF,
                                                   engine_cost=COST)])
    decode = _pool(app, "decode", [GenerateChunk((1,), "a"),
                                   GenerateChunk((2,), "b", "length", engine_cost=COST)])
    d = Dispatcher({"prefill": prefill, "decode": decode}, cfg.disaggregation, RouterMetrics(),
                   Tenancy.from_config(cfg), replicas={"prefill": 1, "decode": 1},
                   tpot_slo_s=0.1)
    for pool in ("prefill", "decode"):
        d.calibration.engine_reported(pool, COST)
    for tokens in (100, 1000, 2000):
        d.calibration.handoff_measured(tokens, 0.02 + 1e-5 * tokens)
    feeds = {pool: pool_feed(app, pool) for pool in ("prefill", "decode")}
    for feed in feeds.values():
        feed.hasher = PromptHasher(BLOCK)  # what the replicas' routing stats advertise
    return d, prefill, decode, feeds


def _run(d: Dispatcher, req: GenerateRequest) -> None:
    async def drain():
        async for _ in d.stream(req, DEFAULT_TENANT):
            pass

    asyncio.run(asyncio.wait_for(drain(), 10))


def _req(n: int, salt: str = "tenant-salt") -> GenerateRequest:
    return GenerateRequest("cmpl-1", tuple(range(1000, 1000 + n)), Sampling(max_tokens=2),
                           cache_salt=salt)


def test_expected_cached_tokens_are_the_best_replicas_reported_prefix() -> None:
    d, _, _, feeds = _setup("app-cached")
    req = _req(100)
    blocks = d._blocks(req)
    assert blocks is not None and blocks.block_size == BLOCK
    assert blocks.hashes == PromptHasher(BLOCK).hashes(req.prompt_token_ids, "tenant-salt")
    assert d.cached_tokens("decode", blocks) == 0
    feeds["decode"].index.store("d1", blocks.hashes[:2])
    feeds["decode"].index.store("d2", blocks.hashes[:5])
    assert d.cached_tokens("decode", blocks) == 5 * BLOCK
    assert d.cached_tokens("prefill", blocks) == 0
    other = d._blocks(_req(100, salt="another-tenant"))
    assert d.cached_tokens("decode", other) == 0  # another tenant's salt: nothing cached


def test_the_prompt_is_hashed_once_and_travels_to_the_pools() -> None:
    d, prefill, decode, _ = _setup("app-travel", prefill="remote")
    req = _req(100)
    _run(d, req)
    expected = PromptHasher(BLOCK).hashes(req.prompt_token_ids, "tenant-salt")
    assert prefill.requests[-1].prompt_blocks.hashes == expected
    assert decode.requests[-1].prompt_blocks.hashes == expected


def test_a_prompt_decode_reports_holding_stays_there() -> None:
    """A long prompt decode's engine does not hold goes remote (its local prefill would break
    the TPOT target beside a stream); the same prompt once decode's events report its blocks
    is prefilled on decode (only its new tokens)."""
    d, _, decode, feeds = _setup("app-holds")
    load = d.load
    d.load = lambda: dataclasses.replace(load(), decode_streams=load().decode_streams + 1)
    req = _req(1600)
    _run(d, req)
    assert decode.requests[-1].kv_transfer_params is not None  # remote: a handoff came
    feeds["decode"].index.store("d1", d._blocks(req).hashes)  # the decode engine's BlockStored
    _run(d, _req(1650))
    assert decode.requests[-1].kv_transfer_params is None  # local: nothing to pull
