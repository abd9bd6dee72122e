"""The `Tenancy` facade: built from config, counts refusals, settles quotas on exit."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from splitserve.config import parse_config
from splitserve.router.tenancy.errors import TenancyError
from splitserve.router.tenancy.keys import hash_api_key
from splitserve.router.tenancy.service import Tenancy, pool_max_in_flight

KEY, OFF_KEY = "sk-ss-acme", "sk-ss-off"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _cfg(**tenancy):
    return parse_config(
        {
            "tenants": [
                {
                    "name": "acme",
                    "weight": 2,
                    "api_key_hashes": [hash_api_key(KEY)],
                    "quotas": {"tokens_per_minute": 1000, "max_concurrent_requests": 2},
                },
                {"name": "off", "enabled": False, "api_key_hashes": [hash_api_key(OFF_KEY)]},
            ],
            "tenancy": tenancy,
        }
    )


def _tenancy(clock=None, **tenancy) -> Tenancy:
    return Tenancy.from_config(
        _cfg(**tenancy), registry=CollectorRegistry(), clock=clock or FakeClock()
    )


def test_authenticate_and_count_refusals() -> None:
    t = _tenancy()
    assert t.authenticate(f"Bearer {KEY}").name == "acme"
    for header, status in [(None, 401), ("Bearer nope", 401), (f"Bearer {OFF_KEY}", 403)]:
        with pytest.raises(TenancyError) as exc:
            t.authenticate(header)
        assert exc.value.status == status
    snap = t.usage.snapshot()
    assert snap["-"]["rejections"] == {"missing_api_key": 1, "invalid_api_key": 1}
    assert snap["off"]["rejections"] == {"tenant_disabled": 1}


def test_request_reserves_then_settles_actual_tokens() -> None:
    t = _tenancy()
    acme = t.authenticate(f"Bearer {KEY}")

    async def scenario() -> None:
        async with t.request(acme, prompt_tokens=100, max_tokens=800) as usage:
            usage.add_output(50)
        # 900 reserved, 150 used: 850 left, so a 700-token request fits right away
        async with t.request(acme, prompt_tokens=100, max_tokens=600):
            pass

    asyncio.run(scenario())
    assert t.usage.snapshot()["acme"] == {
        "requests": 2, "prompt_tokens": 200, "generated_tokens": 50, "rejections": {},
    }


def test_request_settles_even_when_the_body_fails() -> None:
    t = _tenancy()
    acme = t.authenticate(f"Bearer {KEY}")

    async def scenario() -> None:
        for _ in range(3):  # concurrency limit 2: a leaked slot would refuse the third
            with pytest.raises(RuntimeError):
                async with t.request(acme, prompt_tokens=1, max_tokens=1):
                    raise RuntimeError("worker died")

    asyncio.run(scenario())
    assert t.usage.snapshot()["acme"]["requests"] == 3


def test_quota_refusal_is_counted_and_raised() -> None:
    t = _tenancy()
    acme = t.authenticate(f"Bearer {KEY}")

    async def scenario() -> TenancyError:
        async with t.request(acme, prompt_tokens=500, max_tokens=500):
            with pytest.raises(TenancyError) as exc:
                async with t.request(acme, prompt_tokens=10, max_tokens=10):
                    pass
            return exc.value

    err = asyncio.run(scenario())
    assert (err.status, err.reason) == (429, "tpm")
    assert t.usage.snapshot()["acme"]["rejections"] == {"tpm": 1}


def test_admit_uses_the_configured_gate_and_counts_queue_refusals() -> None:
    t = _tenancy(decode_max_in_flight=1, max_queued=1, output_token_weight=3.0)
    acme = t.authenticate(f"Bearer {KEY}")

    async def scenario() -> None:
        async with t.admit("decode", acme, 10) as ticket:
            ticket.add_output(4)
            waiter = asyncio.create_task(t.gates["decode"].acquire(acme, 1))
            await asyncio.sleep(0)
            with pytest.raises(TenancyError):
                async with t.admit("decode", acme, 1):
                    pass
            waiter.cancel()
            await asyncio.sleep(0)  # it leaves the queue before the slot frees: never charged

    asyncio.run(scenario())
    assert t.gates["decode"].in_flight == 0
    assert t.usage.snapshot()["acme"]["rejections"] == {"queue_full": 1}
    # weights from the config: (10 * 1 + 4 * 3) / tenant weight 2
    assert t.gates["decode"].scheduler.counter("acme") == pytest.approx(11.0)


def test_cache_salt_via_facade() -> None:
    t = _tenancy()
    acme = t.authenticate(f"Bearer {KEY}")
    assert t.cache_salt(acme, "u") != t.cache_salt(acme, None)


def test_gate_capacity_defaults_and_overrides() -> None:
    cfg = parse_config(
        {
            "pools": {"decode": {"replicas": 3, "max_num_seqs": 10}},
            "router": {"replicas": 2},
            "tenancy": {"prefill_max_in_flight": 7},
        }
    )
    assert pool_max_in_flight(cfg, "decode") == 15  # 3 x 10 slots over 2 router replicas
    assert pool_max_in_flight(cfg, "prefill") == 7
    colocated = cfg.with_overrides(mode="colocated")
    assert list(Tenancy.from_config(colocated).gates) == ["decode"]


def test_open_mode_default_deployment() -> None:
    t = Tenancy.from_config(parse_config({}))
    assert t.authenticate(None).name == "default"
