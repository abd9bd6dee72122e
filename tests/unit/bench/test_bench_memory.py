"""The soak's memory rule: growth is judged over the run's second half; start/end/peak reported."""

from __future__ import annotations

import pytest

from splitserve.bench.memory import MIB, grew, judged_from, memory_table


def run(per_minute: dict[str, list[float]]) -> list[dict]:
    """Samples once a minute from per-process MiB series."""
    n = len(next(iter(per_minute.values())))
    return [{"t_s": 60.0 * i, "rss": {k: v[i] * MIB for k, v in per_minute.items()}}
            for i in range(n)]


def test_judged_from_is_the_first_sample_at_half_time():
    samples = run({"p": [1.0] * 31})  # 0..30 min
    assert judged_from(samples) == 15
    assert judged_from(samples, 0.0) == 0
    assert judged_from(samples[:2]) == 1  # two samples: the last one


def test_judged_from_needs_samples():
    with pytest.raises(ValueError):
        judged_from([])


def test_warm_up_that_levels_off_passes_but_stays_visible():
    # +37 % in the first half, flat after: bounded warm-up (the shape of the first soak's worker)
    series = [1754 + 650 * min(i, 15) / 15 for i in range(31)]
    rows = memory_table(run({"worker": series}))
    (row,) = rows
    assert row["start_mib"] == 1754.0 and row["end_mib"] == 2404.0 and row["peak_mib"] == 2404.0
    assert row["growth"] == pytest.approx(0.3706, abs=1e-4)
    assert row["judged_growth"] == 0.0
    assert grew(rows, 0.1) == []


def test_a_linear_leak_still_fails():
    # +25 % over the run at a constant rate: about +11 % over the second half
    rows = memory_table(run({"leaky": [100 + 25 * i / 30 for i in range(31)],
                             "flat": [50.0] * 31}))
    assert [r["process"] for r in grew(rows, 0.1)] == ["leaky"]


def test_processes_missing_at_either_end_are_left_out():
    samples = run({"a": [1.0, 1.0, 1.0]})
    samples[0]["rss"]["gone"] = MIB
    samples[2]["rss"]["late"] = MIB
    assert [r["process"] for r in memory_table(samples)] == ["a"]
