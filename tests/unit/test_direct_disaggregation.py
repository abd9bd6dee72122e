"""Direct streaming with disaggregation, the router's side: `Dispatcher.handoff` (the decision,
the decode reservation and the remote prefill before the decode replica is picked) and the
verdict that carries the KV handoff to the decode replica (`Router._route_verdict`). The real
dispatcher, tenancy and router over scripted pools (tests/unit/router_fakes.py); the e2e side
is tests/e2e/test_direct_disaggregated.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from splitserve.config import parse_config
from splitserve.engine.messages import GenerateRequest, Sampling
from splitserve.engine.routed import Settlement
from splitserve.router import direct
from splitserve.router import tracing as tr

from tests.unit.router_fakes import HANDOFF, PREFILL_OK, Pool, build_router, config, dispatcher

REQ = GenerateRequest("cmpl-1", tuple(range(300)), Sampling(max_tokens=8))


def _handoff(cfg, prefill: Pool, req: GenerateRequest = REQ):
    d = dispatcher(cfg, prefill, Pool([]), tr.Tracing.from_config(cfg.tracing))

    async def run():
        return await d.handoff(req, d.tenancy.authenticate(None))

    return d, asyncio.run(run())


def test_a_remote_prefill_hands_the_decode_request_its_kv():
    prefill = Pool(PREFILL_OK)
    d, got = _handoff(config(), prefill)
    (sent,) = prefill.requests
    assert sent.request_id == "cmpl-1-prefill" and sent.kv_transfer_params == {
        "do_remote_decode": True}
    params = got.request.kv_transfer_params
    assert params["do_remote_prefill"] is True
    assert params["remote_engine_id"] == HANDOFF["remote_engine_id"]
    assert params["remote_block_ids"] == HANDOFF["remote_block_ids"]
    assert got.request.request_id == "cmpl-1"  # the client's request keeps its id
    assert got.pulled == 300  # nothing cached on decode: the whole prompt is pulled
    assert got.reservation is None  # no decode request router in this process to reserve with
    assert d.metrics.registry.get_sample_value(
        "splitserve_disagg_decisions_total", {"path": "remote"}) == 1


def test_a_failed_prefill_leaves_the_prompt_to_the_decode_engine():
    prefill = Pool(RuntimeError("prefill replica died"))
    d, got = _handoff(config(prefill_attempts=2), prefill)
    assert len(prefill.requests) == 2  # retried, then local
    assert got.request.kv_transfer_params is None and got.pulled is None
    assert d.metrics.registry.get_sample_value("splitserve_prefill_fallbacks_total") == 1


def test_a_prompt_the_rule_keeps_local_is_not_prefilled():
    prefill = Pool(PREFILL_OK)
    short = dataclasses.replace(REQ, prompt_token_ids=(1, 2, 3))
    _, got = _handoff(config(min_remote_prompt_tokens=64), prefill, short)
    assert prefill.requests == [] and got.request.kv_transfer_params is None
    assert got.pulled is None


def test_the_verdict_carries_the_handoff_and_the_settlement_measures_it():
    cfg = parse_config({"mode": "disaggregated", "disaggregation": {"prefill": "remote"},
                        "router": {"direct_ingress": True, "direct_streaming": True}})
    prefill = Pool(PREFILL_OK)
    router = build_router(cfg, prefill, Pool([]))
    router.leases = direct.Leases()
    body = json.dumps({"model": "splitserve-tiny", "prompt": list(range(10, 310)),
                       "max_tokens": 4}).encode()
    measured = []
    router.dispatcher.calibration.handoff_measured = lambda n, s: measured.append((n, s))

    async def run():
        verdict, handoff = await router._route_verdict({}, body, "http://127.0.0.1:1")
        assert handoff is not None
        router.dispatcher.release(handoff.reservation)
        lease = router.leases.take(verdict.ticket)
        await direct.settle(lease, Settlement(verdict.ticket, output_tokens=4,
                                              first_token_s=0.25, decode_s=0.1))
        return verdict

    verdict = asyncio.run(run())
    assert verdict.kind == "serve"
    assert verdict.kv_transfer_params["remote_engine_id"] == HANDOFF["remote_engine_id"]
    assert prefill.requests[0].request_id == f"{verdict.request_id}-prefill"
    # the replica's first token, 0.25 s after the verdict, less a decode step (none measured)
    assert measured == [(300, 0.25)]
