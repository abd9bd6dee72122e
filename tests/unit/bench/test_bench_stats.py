"""Percentiles, TPOT, SLO attainment and goodput (boundary included), sweep summaries."""

from __future__ import annotations

import pytest

from splitserve.bench.results import RequestResult
from splitserve.bench.stats import (
    SLO,
    max_rate_meeting,
    meets_slo,
    percentiles,
    summarize,
    summarize_sweep,
)

SLO_ = SLO(ttft_ms=200, tpot_ms=50)


def result(ttft=0.1, e2e=0.5, out=9, error=None, status=200, itl=(), max_tokens=9):
    return RequestResult(
        index=0, scheduled_s=0.0, prompt_tokens=4, max_tokens=max_tokens, sent_s=0.0,
        ttft_s=ttft, itl_s=list(itl), e2e_s=e2e, output_tokens=out, status_code=status,
        error=error,
    )


def test_percentiles_linear_like_numpy():
    p = percentiles(range(1, 102))
    assert p == {"mean": 51.0, "p50": 51.0, "p90": 91.0, "p99": 100.0}
    assert percentiles([1.0, 2.0], scale=1000)["p50"] == pytest.approx(1500.0)
    assert percentiles([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_tpot():
    assert result(ttft=0.1, e2e=0.5, out=9).tpot_s == pytest.approx(0.05)
    assert result(out=1).tpot_s is None
    assert result(out=None).tpot_s is None
    assert result(error="x").tpot_s is None


def test_slo_boundary_counts_as_met():
    slo = SLO(ttft_ms=250, tpot_ms=62.5)  # binary-exact: TTFT 0.25 s, TPOT (0.75 - 0.25) / 8
    assert meets_slo(result(ttft=0.25, e2e=0.75, out=9), slo)
    assert not meets_slo(result(ttft=0.25 + 1e-9, e2e=0.75 + 1e-9, out=9), slo)
    assert not meets_slo(result(ttft=0.25, e2e=0.75 + 1e-6, out=9), slo)
    assert meets_slo(result(ttft=0.2, e2e=0.6, out=9), SLO_)  # 200 ms, ~50 ms


def test_every_gap_also_bounds_each_gap_between_two_tokens():
    # mean TPOT 50 ms (met), but one gap of 120 ms: met on the mean, missed on every gap
    stalled = result(ttft=0.1, e2e=0.5, out=9, itl=[0.04] * 7 + [0.12])
    assert meets_slo(stalled, SLO_) and not meets_slo(stalled, SLO_, every_gap=True)
    steady = result(ttft=0.1, e2e=0.5, out=9, itl=[0.05] * 8)
    assert meets_slo(steady, SLO_, every_gap=True)
    assert meets_slo(result(ttft=0.15, e2e=9.0, out=1), SLO_, every_gap=True)  # no gap
    assert not meets_slo(result(ttft=0.3, itl=[0.01] * 8), SLO_, every_gap=True)


def test_single_token_judged_on_ttft_and_failures_never_meet():
    assert meets_slo(result(ttft=0.15, e2e=9.0, out=1), SLO_)
    assert not meets_slo(result(ttft=0.25, e2e=0.3, out=1), SLO_)
    assert not meets_slo(result(ttft=0.01, e2e=0.02, error="boom", status=500), SLO_)
    assert not meets_slo(result(ttft=None), SLO_)


def test_summary_goodput_attainment_throughput():
    rs = [
        result(ttft=0.1, e2e=0.5, out=9, itl=[0.05] * 8),  # met
        result(ttft=0.2, e2e=0.6, out=9),  # met at the boundary
        result(ttft=0.3, e2e=0.7, out=9),  # TTFT missed
        result(ttft=0.1, e2e=1.0, out=9),  # TPOT missed (112.5 ms)
        result(ttft=None, e2e=0.1, out=None, error="overloaded", status=503),
        result(ttft=None, e2e=0.1, out=None, error="overloaded", status=503),
    ]
    s = summarize(rs, duration_s=2.0, slo=SLO_)
    assert s["requests"] == {"total": 6, "succeeded": 4, "failed": 2}
    assert s["errors"] == {"503: overloaded": 2}
    assert s["slo"]["met"] == 2
    assert s["slo"]["attainment"] == pytest.approx(2 / 6)
    assert s["slo"]["goodput_rps"] == pytest.approx(1.0)
    # the second request has no gaps recorded: every gap holds; the first's are all 50 ms
    assert s["slo"]["met_every_gap"] == 2
    assert s["slo"]["goodput_every_gap_rps"] == pytest.approx(1.0)
    assert s["throughput"]["requests_per_s"] == pytest.approx(2.0)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(18.0)
    assert s["tokens"] == {"prompt": 16, "output": 36, "output_requested": 36}
    assert s["latency_ms"]["ttft"]["p50"] == pytest.approx(150.0)
    assert s["latency_ms"]["itl"]["p99"] == pytest.approx(50.0)
    assert s["latency_ms"]["e2e"]["mean"] == pytest.approx(700.0)


def test_summary_of_all_failed_has_no_latencies():
    s = summarize([result(ttft=None, error="x", status=None)], 1.0, SLO_)
    assert s["latency_ms"]["ttft"]["p50"] is None and s["slo"]["goodput_rps"] == 0.0


def point(rate, attainment, goodput=0.0):
    return {"rate": rate, "attainment": attainment, "goodput_rps": goodput}


def test_max_rate_meeting_stops_at_first_miss():
    pts = [point(4, 0.95), point(1, 1.0), point(8, 0.5), point(16, 0.92), point(2, 0.9)]
    assert max_rate_meeting(pts) == 4  # 16 met again by luck: does not count
    assert max_rate_meeting([point(1, 0.89)]) is None
    sweep = summarize_sweep([point(2, 1.0, 2.0), point(1, 1.0, 1.0), point(4, 0.5, 1.9)])
    assert [p["rate"] for p in sweep["points"]] == [1, 2, 4]
    assert sweep["max_rate_meeting_target"] == 2 and sweep["max_goodput_rps"] == 2.0
