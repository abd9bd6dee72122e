"""Quotas on a fake clock: RPM, TPM (reserve then reconcile), concurrency, request size."""

from __future__ import annotations

import asyncio

import pytest

from splitserve.router.tenancy.buckets import TokenBucket
from splitserve.router.tenancy.errors import TenancyError
from splitserve.router.tenancy.quotas import LocalQuotaLimiter
from splitserve.router.tenancy.tenants import QuotaLimits, Tenant


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tenant(**limits: int) -> Tenant:
    return Tenant("acme", quotas=QuotaLimits(**limits))


def _limited(limiter: LocalQuotaLimiter, tenant: Tenant, tokens: int) -> TenancyError:
    with pytest.raises(TenancyError) as exc:
        limiter.try_reserve(tenant, tokens)
    return exc.value


def test_unlimited_tenant_always_admitted() -> None:
    limiter = LocalQuotaLimiter(clock=FakeClock())
    for _ in range(1000):
        limiter.try_reserve(_tenant(), 10_000)
    assert limiter.in_flight("acme") == 1000


def test_rpm_429_with_retry_after_then_recovers() -> None:
    clock = FakeClock()
    limiter, tenant = LocalQuotaLimiter(clock=clock), _tenant(requests_per_minute=2)
    limiter.try_reserve(tenant, 1)
    limiter.try_reserve(tenant, 1)
    err = _limited(limiter, tenant, 1)
    assert (err.status, err.type, err.code, err.reason) == (
        429, "requests", "rate_limit_exceeded", "rpm",
    )
    assert err.headers["Retry-After"] == "30"  # one request refills at 2/60 per second
    clock.now += 29.5
    assert _limited(limiter, tenant, 1).headers["Retry-After"] == "1"
    clock.now += 0.5
    limiter.try_reserve(tenant, 1)
    clock.now += 60  # a whole window later the bucket is full again: two at once
    limiter.try_reserve(tenant, 1)
    limiter.try_reserve(tenant, 1)
    assert _limited(limiter, tenant, 1).reason == "rpm"


def test_tpm_429_with_retry_after_for_the_missing_tokens() -> None:
    clock = FakeClock()
    limiter, tenant = LocalQuotaLimiter(clock=clock), _tenant(tokens_per_minute=1200)
    limiter.try_reserve(tenant, 600)
    limiter.try_reserve(tenant, 600)
    err = _limited(limiter, tenant, 300)
    assert (err.status, err.type, err.reason) == (429, "tokens", "tpm")
    assert err.headers["Retry-After"] == "15"  # 300 tokens at 20 tokens/s
    clock.now += 10
    assert _limited(limiter, tenant, 300).headers["Retry-After"] == "5"
    clock.now += 5
    limiter.try_reserve(tenant, 300)


def test_tpm_reconciles_reservation_with_actual_usage() -> None:
    clock = FakeClock()
    limiter, tenant = LocalQuotaLimiter(clock=clock), _tenant(tokens_per_minute=1000)
    r = limiter.try_reserve(tenant, 600)  # prompt 100 + max_tokens 500
    assert _limited(limiter, tenant, 900).headers["Retry-After"] == "30"
    assert limiter.settle_now(r, 100)  # it stopped early: 500 tokens come back
    limiter.try_reserve(tenant, 900)


def test_usage_beyond_reservation_is_charged() -> None:
    clock = FakeClock()
    limiter, tenant = LocalQuotaLimiter(clock=clock), _tenant(tokens_per_minute=600)
    r = limiter.try_reserve(tenant, 100)
    limiter.settle_now(r, 400)  # 300 more than reserved: level 600 - 400 = 200
    assert _limited(limiter, tenant, 300).headers["Retry-After"] == "10"  # 100 tokens at 10/s


def test_concurrency_limit_and_release() -> None:
    limiter, tenant = LocalQuotaLimiter(clock=FakeClock()), _tenant(max_concurrent_requests=2)
    first = limiter.try_reserve(tenant, 1)
    limiter.try_reserve(tenant, 1)
    err = _limited(limiter, tenant, 1)
    assert (err.status, err.reason, err.headers["Retry-After"]) == (429, "concurrency", "1")
    assert limiter.settle_now(first, 1)
    assert not limiter.settle_now(first, 1)  # a second settle is ignored
    assert limiter.in_flight("acme") == 1
    limiter.try_reserve(tenant, 1)
    assert limiter.in_flight("acme") == 2


def test_refusal_reserves_nothing() -> None:
    clock = FakeClock()
    limiter = LocalQuotaLimiter(clock=clock)
    tenant = _tenant(requests_per_minute=2, tokens_per_minute=1000)
    limiter.try_reserve(tenant, 1000)
    _limited(limiter, tenant, 500)  # TPM refuses: the RPM bucket must not be charged
    clock.now += 30  # 500 tokens back
    limiter.try_reserve(tenant, 500)  # needs the second (unspent) request


def test_reason_is_the_limit_with_the_longest_wait() -> None:
    clock = FakeClock()
    limiter = LocalQuotaLimiter(clock=clock)
    tenant = _tenant(requests_per_minute=60, tokens_per_minute=600)
    limiter.try_reserve(tenant, 600)
    err = _limited(limiter, tenant, 600)  # RPM would wait 0 s, TPM 60 s
    assert (err.reason, err.headers["Retry-After"]) == ("tpm", "60")


@pytest.mark.parametrize(
    ("limits", "what"),
    [
        ({"max_tokens_per_request": 100}, "tokens per request"),
        ({"tokens_per_minute": 100}, "tokens per minute"),
    ],
)
def test_request_that_can_never_fit_is_400(limits: dict, what: str) -> None:
    err = _limited(LocalQuotaLimiter(clock=FakeClock()), _tenant(**limits), 101)
    assert (err.status, err.reason, err.param) == (400, "request_too_large", "max_tokens")
    assert what in err.message


def test_share_splits_limits_across_router_replicas() -> None:
    clock = FakeClock()
    limiter = LocalQuotaLimiter(share=2, clock=clock)
    by_rate = _tenant(requests_per_minute=4)
    limiter.try_reserve(by_rate, 1)
    limiter.try_reserve(by_rate, 1)
    err = _limited(limiter, by_rate, 1)
    assert err.reason == "rpm" and err.headers["Retry-After"] == "30"  # 2/min here
    by_slots = Tenant("slots", quotas=QuotaLimits(max_concurrent_requests=3))
    limiter.try_reserve(by_slots, 1)
    assert _limited(limiter, by_slots, 1).reason == "concurrency"  # 3 // 2 = 1 slot here


def test_share_smaller_than_one_request_still_admits_at_the_right_rate() -> None:
    clock = FakeClock()
    limiter = LocalQuotaLimiter(share=4, clock=clock)
    tenant = _tenant(requests_per_minute=2)  # half a request per minute per replica
    limiter.try_reserve(tenant, 1)
    assert _limited(limiter, tenant, 1).headers["Retry-After"] == "120"
    clock.now += 120
    limiter.try_reserve(tenant, 1)


def test_async_backend_interface() -> None:
    limiter, tenant = LocalQuotaLimiter(clock=FakeClock()), _tenant(max_concurrent_requests=1)

    async def scenario() -> int:
        r = await limiter.reserve(tenant, 5)
        await limiter.settle(r, 5)
        await limiter.reserve(tenant, 5)
        return limiter.in_flight("acme")

    assert asyncio.run(scenario()) == 1


def test_bucket_ignores_a_clock_that_goes_backwards() -> None:
    bucket = TokenBucket.per_minute(60, now=100.0)
    bucket.take(60, now=100.0)
    bucket.give(0, now=50.0)
    assert bucket.wait_s(1, now=101.0) == pytest.approx(0.0)
    assert bucket.level == pytest.approx(1.0)


@pytest.mark.parametrize(("limits", "prompt", "room", "choices", "allowance"), [
    (QuotaLimits(), 300, 1748, 1, 1748),  # no limit: what the context leaves
    (QuotaLimits(max_tokens_per_request=4096), 300, 1748, 1, 1748),  # the context ends first
    (QuotaLimits(max_tokens_per_request=1000), 300, 1748, 1, 700),  # the per-request cap does
    (QuotaLimits(tokens_per_minute=500), 300, 1748, 1, 200),  # a minute's tokens do
    (QuotaLimits(max_tokens_per_request=1000), 300, 1748, 2, 350),  # shared by the choices
    (QuotaLimits(max_tokens_per_request=200), 300, 1748, 1, 1),  # the prompt alone is over
])
def test_output_allowance_is_what_the_tenant_can_be_charged_for(
    limits, prompt, room, choices, allowance
):
    from splitserve.router.tenancy.quotas import output_allowance

    assert output_allowance(limits, prompt, room, choices) == allowance
