"""The router's health endpoints over fake pools (router_fakes.py): `/health` and `/health/ready`
answer the readiness decision with short words only, the exception going to the log;
`/health/live` pings nothing."""

from __future__ import annotations

import asyncio
import json
import logging

from router_fakes import DECODE_OK, PREFILL_OK, Pool, build_router, config

from splitserve.config import parse_config

SECRET = "connection refused by 10.1.2.3:6379 secret-token"


def _answer(response) -> tuple[int, dict]:
    return response.status_code, json.loads(response.body)


def _router(**overrides):
    prefill, decode = Pool(PREFILL_OK), Pool(DECODE_OK)
    cfg = config().with_overrides(**overrides) if overrides else config()
    return build_router(cfg, prefill, decode), prefill, decode


def test_all_pools_answer() -> None:
    router, _, _ = _router()
    for endpoint in (router.health, router.health_ready):
        assert _answer(asyncio.run(endpoint())) == (200, {
            "status": "ok", "pools": {"prefill": "ok", "decode": "ok"},
            "models": {"splitserve-tiny": "ok"}})


def test_a_failing_prefill_pool_is_degraded_and_its_error_only_logged(caplog) -> None:
    router, prefill, _ = _router()
    prefill.health_outcome = RuntimeError(SECRET)
    with caplog.at_level(logging.WARNING, logger="splitserve.router"):
        status, body = _answer(asyncio.run(router.health()))
    assert status == 200
    assert body["status"] == "degraded"
    assert body["pools"] == {"prefill": "unavailable", "decode": "ok"}
    assert "secret" not in json.dumps(body) and "Error" not in json.dumps(body)
    assert any(SECRET in r.getMessage() and "prefill" in r.getMessage() for r in caplog.records)
    # logged once per change of state, not on every probe
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="splitserve.router"):
        asyncio.run(router.health())
    assert not caplog.records


def test_a_hung_prefill_pool_times_out_and_is_cancelled() -> None:
    router, prefill, _ = _router(**{"router.health_timeout_s": 0.05})
    hang = asyncio.Event()
    prefill.health_outcome = hang
    sent = []
    remote = prefill.health.remote
    prefill.health.remote = lambda: sent.append(remote()) or sent[-1]
    status, body = _answer(asyncio.run(router.health()))
    assert (status, body["status"], body["pools"]["prefill"]) == (200, "degraded", "timeout")
    assert sent[0].cancelled


def test_a_failing_decode_pool_is_not_ready() -> None:
    router, _, decode = _router()
    decode.health_outcome = RuntimeError(SECRET)
    for endpoint in (router.health, router.health_ready):
        status, body = _answer(asyncio.run(endpoint()))
        assert status == 503
        assert body == {"status": "unavailable",
                        "pools": {"prefill": "ok", "decode": "unavailable"},
                        "models": {"splitserve-tiny": "unavailable"}}


def test_liveness_pings_no_pool() -> None:
    router, prefill, decode = _router()
    pinged = []
    for pool in (prefill, decode):
        pool.health.remote = lambda: pinged.append(1)
    assert _answer(asyncio.run(router.health_live())) == (200, {"status": "ok"})
    assert not pinged


def test_several_models_stay_ready_while_one_is_served() -> None:
    cfg = parse_config({"models": [{"model": {"name": "tiny-v1"}},
                                   {"model": {"name": "tiny-v2", "tiny_variant": 1},
                                    "mode": "colocated"}]})
    pools = {"tiny-v1": {"prefill": Pool(PREFILL_OK), "decode": Pool(DECODE_OK)},
             "tiny-v2": {"decode": Pool(DECODE_OK)}}
    router = build_router(cfg, None, None, pools=pools)
    pools["tiny-v2"]["decode"].health_outcome = RuntimeError(SECRET)
    status, body = _answer(asyncio.run(router.health()))
    assert status == 200
    assert body == {"status": "degraded",
                    "pools": {"tiny-v1/prefill": "ok", "tiny-v1/decode": "ok",
                              "tiny-v2/decode": "unavailable"},
                    "models": {"tiny-v1": "ok", "tiny-v2": "unavailable"}}
    pools["tiny-v1"]["decode"].health_outcome = RuntimeError(SECRET)
    assert asyncio.run(router.health()).status_code == 503
