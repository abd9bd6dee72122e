"""Usage ledger snapshot and its Prometheus mirror."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from splitserve.router.tenancy.usage import UsageLedger, UsageMetrics


def _fill(ledger: UsageLedger) -> None:
    ledger.record_request("a")
    ledger.record_request("a")
    ledger.record_tokens("a", prompt_tokens=100, generated_tokens=20)
    ledger.record_tokens("a", prompt_tokens=5, generated_tokens=1)
    ledger.record_rejection("a", "rpm")
    ledger.record_rejection("a", "rpm")
    ledger.record_rejection("b", "queue_full")


def test_snapshot_counts_per_tenant() -> None:
    ledger = UsageLedger()
    _fill(ledger)
    snap = ledger.snapshot()
    assert snap["a"] == {
        "requests": 2, "prompt_tokens": 105, "generated_tokens": 21, "rejections": {"rpm": 2},
    }
    assert snap["b"] == {
        "requests": 0, "prompt_tokens": 0, "generated_tokens": 0, "rejections": {"queue_full": 1},
    }
    assert set(snap) == {"a", "b"}


def test_snapshot_is_a_copy() -> None:
    ledger = UsageLedger()
    _fill(ledger)
    ledger.snapshot()["a"]["rejections"]["rpm"] = 99
    assert ledger.snapshot()["a"]["rejections"]["rpm"] == 2


def test_prometheus_counters_mirror_the_ledger() -> None:
    registry = CollectorRegistry()
    ledger = UsageLedger(UsageMetrics(registry))
    _fill(ledger)
    value = registry.get_sample_value
    assert value("splitserve_tenant_requests_total", {"tenant": "a"}) == 2
    assert value("splitserve_tenant_prompt_tokens_total", {"tenant": "a"}) == 105
    assert value("splitserve_tenant_generation_tokens_total", {"tenant": "a"}) == 21
    assert value("splitserve_tenant_rejections_total", {"tenant": "a", "reason": "rpm"}) == 2
    assert value("splitserve_tenant_rejections_total", {"tenant": "b", "reason": "queue_full"}) == 1
    assert value("splitserve_tenant_requests_total", {"tenant": "b"}) is None
