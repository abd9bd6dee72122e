"""Report files and plots, and a whole run (single and sweep) through the fake server."""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench_fakes import FakeServer

from splitserve.bench.client import Target
from splitserve.bench.report import (
    format_summary,
    format_sweep,
    json_safe,
    rate_dir_name,
    read_requests,
    write_json,
)
from splitserve.bench.runner import BenchConfig, run_bench
from splitserve.bench.stats import SLO
from splitserve.bench.workload import LengthSpec, WorkloadSpec

PNG = b"\x89PNG\r\n\x1a\n"


def config(out: Path, **kw) -> BenchConfig:
    workload = WorkloadSpec(6, LengthSpec.parse("8"), LengthSpec.parse("4"), rate=50.0, seed=3)
    base = dict(target=Target("http://bench.invalid/v1", "tiny"), workload=workload,
                slo=SLO(1000, 100), out_dir=out)
    return BenchConfig(**{**base, **kw})


def test_json_safe_and_strict(tmp_path):
    assert json_safe({"a": [math.inf, 1.0, (2, -math.inf)], "b": math.nan}) == {
        "a": ["inf", 1.0, [2, "-inf"]], "b": "nan"}
    path = write_json(tmp_path / "x" / "s.json", {"rate": math.inf})
    assert json.loads(path.read_text()) == {"rate": "inf"}


def test_rate_dir_name():
    assert [rate_dir_name(r) for r in (0.5, 4.0, math.inf)] == ["rate-0.5", "rate-4", "rate-inf"]


def test_single_run_writes_summary_requests_and_plot(tmp_path):
    server = FakeServer(gap_s=0.001)
    summary = run_bench(config(tmp_path, warmup=2), transport=server.transport())
    assert len(server.bodies) == 2 + 6  # warm-up requests are sent but not measured
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert on_disk["config"]["prompt_len"] == "8" and on_disk["config"]["seed"] == 3
    assert on_disk["requests"] == {"total": 6, "succeeded": 6, "failed": 0}
    assert on_disk["tokens"]["output"] == 24 and on_disk["slo"]["attainment"] == 1.0
    results = read_requests(tmp_path / "requests.jsonl")
    assert [r.index for r in results] == list(range(6))
    assert all(r.ok and r.output_tokens == 4 for r in results)
    assert (tmp_path / "latency_cdf.png").read_bytes().startswith(PNG)
    text = format_summary(summary)
    assert "6/6 ok" in text and "attainment 100.0%" in text and "ttft" in text


def test_sweep_writes_per_rate_dirs_and_sweep_plot(tmp_path):
    seen = []
    sweep = run_bench(config(tmp_path, sweep_rates=(20.0, 10.0)),
                      on_rate=lambda rate, s: seen.append(rate),
                      transport=FakeServer().transport())
    assert seen == [10.0, 20.0]
    for rate in ("rate-10", "rate-20"):
        assert json.loads((tmp_path / rate / "summary.json").read_text())["requests"]["total"] == 6
    on_disk = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["rate"] for p in on_disk["points"]] == [10.0, 20.0]
    assert on_disk["max_rate_meeting_target"] == 20.0
    assert (tmp_path / "sweep.png").read_bytes().startswith(PNG)
    assert "max rate with attainment >= 90%: 20 req/s" in format_sweep(sweep)


def test_failed_run_is_reported(tmp_path):
    import httpx

    transport = httpx.MockTransport(lambda r: httpx.Response(503, text="busy"))
    summary = run_bench(config(tmp_path, plots=False), transport=transport)
    assert summary["requests"]["failed"] == 6 and summary["errors"] == {"503: busy": 6}
    assert summary["slo"]["goodput_rps"] == 0.0 and not (tmp_path / "latency_cdf.png").exists()
    assert "error x6: 503: busy" in format_summary(summary)
