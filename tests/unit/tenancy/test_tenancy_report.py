"""The /v1/usage report: snapshots of several replicas summed, quota windows, the tenant filter."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from splitserve.config import parse_config
from splitserve.router.errors import APIError
from splitserve.router.tenancy.keys import hash_api_key
from splitserve.router.tenancy.quotas import LocalQuotaLimiter, QuotaWindow
from splitserve.router.tenancy.report import (
    FRESH_S,
    ReplicaSnapshot,
    merge_quota,
    merge_usage,
    usage_report,
)
from splitserve.router.tenancy.service import Tenancy
from splitserve.router.tenancy.tenants import QuotaLimits, Tenant

ACME = Tenant("acme", quotas=QuotaLimits(requests_per_minute=60, tokens_per_minute=600,
                                         max_concurrent_requests=4))
BETA = Tenant("beta")
TENANTS = {"acme": ACME, "beta": BETA}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _usage(requests: int, prompt: int, generated: int, **rejections: int) -> dict:
    return {
        "requests": requests,
        "prompt_tokens": prompt,
        "generated_tokens": generated,
        "rejections": rejections,
    }


def test_merge_usage_adds_counters_and_reasons() -> None:
    total = merge_usage(
        [
            {"acme": _usage(2, 100, 20, rpm=1), "-": _usage(0, 0, 0, invalid_api_key=3)},
            {"acme": _usage(1, 5, 1, rpm=2, queue_full=1)},
        ]
    )
    assert total["acme"] == _usage(3, 105, 21, rpm=3, queue_full=1)
    assert total["-"] == _usage(0, 0, 0, invalid_api_key=3)


def test_merge_quota_sums_in_flight_and_what_is_left() -> None:
    w = merge_quota(
        [
            {"in_flight": 1, "requests_available": 10.0, "tokens_available": None},
            {"in_flight": 2, "requests_available": -1.5, "tokens_available": None},
        ]
    )
    assert w == QuotaWindow(in_flight=3, requests_available=8.5, tokens_available=None)
    assert merge_quota([]) == QuotaWindow()


def test_report_sums_replicas_and_lists_every_tenant() -> None:
    quota = {"in_flight": 1, "requests_available": 20.0, "tokens_available": 250.0}
    snaps = [
        ReplicaSnapshot({"acme": _usage(2, 30, 8, rpm=1)}, {"acme": quota}),
        ReplicaSnapshot({"acme": _usage(1, 10, 4), "-": _usage(0, 0, 0, missing_api_key=1)},
                        {"acme": quota}, age_s=0.5),
    ]
    report = usage_report(snaps, TENANTS, scope="cluster")
    assert report["object"] == "usage" and report["scope"] == "cluster"
    assert report["replicas"] == 2
    assert list(report["tenants"]) == ["acme", "beta", "-"]
    acme = report["tenants"]["acme"]
    assert acme["requests"] == 3
    assert (acme["prompt_tokens"], acme["completion_tokens"], acme["total_tokens"]) == (40, 12, 52)
    assert acme["rejections"] == {"rpm": 1}
    assert acme["quota"] == {
        "requests_per_minute": 60,
        "requests_available": 40.0,
        "tokens_per_minute": 600,
        "tokens_available": 500.0,
        "max_concurrent_requests": 4,
        "in_flight": 2,
        "max_tokens_per_request": None,
    }
    beta = report["tenants"]["beta"]
    assert beta["requests"] == 0 and beta["rejections"] == {}
    assert beta["quota"]["requests_per_minute"] is None
    assert report["tenants"]["-"]["rejections"] == {"missing_api_key": 1}
    assert report["tenants"]["-"]["quota"] is None


def test_a_gone_replica_keeps_its_counts_but_not_its_quota_state() -> None:
    quota = {"in_flight": 1, "requests_available": 20.0, "tokens_available": 250.0}
    snaps = [
        ReplicaSnapshot({"acme": _usage(1, 10, 2)}, {"acme": quota}),
        ReplicaSnapshot({"acme": _usage(5, 50, 10)}, {"acme": quota}, age_s=FRESH_S + 1),
    ]
    acme = usage_report(snaps, TENANTS, scope="cluster")["tenants"]["acme"]
    assert acme["requests"] == 6
    assert acme["quota"]["in_flight"] == 1
    assert acme["quota"]["requests_available"] == 20.0


def test_tenant_filter() -> None:
    snaps = [ReplicaSnapshot({"-": _usage(0, 0, 0, invalid_api_key=1)})]
    report = usage_report(snaps, TENANTS, scope="replica", only="beta")
    assert list(report["tenants"]) == ["beta"] and report["scope"] == "replica"
    assert list(usage_report(snaps, TENANTS, scope="cluster", only="-")["tenants"]) == ["-"]
    with pytest.raises(APIError) as exc:
        usage_report(snaps, TENANTS, scope="cluster", only="nobody")
    assert exc.value.status == 404
    assert exc.value.code == "tenant_not_found" and exc.value.param == "tenant"


def test_quota_window_of_the_local_limiter() -> None:
    clock = FakeClock()
    limiter = LocalQuotaLimiter(share=2, clock=clock)
    assert limiter.window(ACME) == QuotaWindow(0, 30.0, 300.0)  # never seen: a full share
    reservation = limiter.try_reserve(ACME, 100)
    assert limiter.window(ACME) == QuotaWindow(1, 29.0, 200.0)
    limiter.settle_now(reservation, 40)
    clock.now = 6.0  # 6 s refill 3 requests and 30 tokens at 30 / 300 per minute
    assert limiter.window(ACME) == QuotaWindow(0, 30.0, 290.0)
    assert limiter.window(BETA) == QuotaWindow(0, None, None)


def test_tenancy_snapshot_is_plain_data() -> None:
    cfg = parse_config(
        {
            "tenants": [
                {
                    "name": "acme",
                    "api_key_hashes": [hash_api_key("sk-ss-k")],
                    "quotas": {"requests_per_minute": 10},
                }
            ]
        }
    )
    tenancy = Tenancy.from_config(cfg, registry=CollectorRegistry(), clock=FakeClock())
    acme = tenancy.tenants["acme"]

    async def one_request() -> None:
        async with tenancy.request(acme, prompt_tokens=7, max_tokens=3) as usage:
            usage.add_output(2)

    asyncio.run(one_request())
    snap = tenancy.snapshot()
    assert snap["usage"]["acme"] == _usage(1, 7, 2)
    assert snap["quota"] == {
        "acme": {"in_flight": 0, "requests_available": 9.0, "tokens_available": None}
    }
    report = usage_report([ReplicaSnapshot.of(snap)], tenancy.tenants, scope="replica")
    assert report["tenants"]["acme"]["completion_tokens"] == 2


def test_open_mode_reports_the_default_tenant() -> None:
    tenancy = Tenancy.from_config(parse_config({}), registry=CollectorRegistry())
    assert list(tenancy.tenants) == ["default"]
    assert list(tenancy.snapshot()["quota"]) == ["default"]
