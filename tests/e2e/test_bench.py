"""`splitserve bench` against a real colocated deployment (Ray Serve router + one vLLM engine).

One deployment for the module; a single run, a two-rate sweep and a multi-turn replay, each a
few seconds.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from splitserve.bench.report import read_requests
from splitserve.bench.stats import SLO, meets_slo
from splitserve.cli import main
from tests.conftest import pool_stats, shared_deployment, test_config

pytestmark = pytest.mark.engine

PNG = b"\x89PNG\r\n\x1a\n"
N, PROMPT, OUTPUT = 12, 64, 8


@pytest.fixture(scope="module")
def base_url():
    with shared_deployment(test_config(mode="colocated")) as base:
        yield f"{base}/v1"


def bench(base_url: str, out, *extra: str) -> int:
    return main(
        [
            "bench",
            "--base-url",
            base_url,
            "--model",
            "splitserve-tiny",
            "--num-requests",
            str(N),
            "--prompt-len",
            str(PROMPT),
            "--output-len",
            str(OUTPUT),
            "--seed",
            "0",
            "--ttft-slo-ms",
            "1000",
            "--tpot-slo-ms",
            "100",
            "--out",
            str(out),
            *extra,
        ]
    )


def test_single_run(base_url, tmp_path, capsys):
    assert bench(base_url, tmp_path, "--rate", "8", "--warmup", "1") == 0
    print(capsys.readouterr().out)  # the table, for -s runs
    s = json.loads((tmp_path / "summary.json").read_text())
    results = read_requests(tmp_path / "requests.jsonl")

    assert s["requests"] == {"total": N, "succeeded": N, "failed": 0} and s["errors"] == {}
    assert len(results) == N
    for r in results:
        assert r.ok and r.status_code == 200 and r.output_tokens == OUTPUT
        assert r.prompt_tokens == PROMPT and 0 < r.ttft_s <= r.e2e_s
        assert 1 <= r.chunks <= OUTPUT and len(r.itl_s) == r.chunks - 1
        assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / (OUTPUT - 1))

    duration = s["duration_s"]
    assert duration >= max(r.sent_s + r.e2e_s for r in results) - 1e-6
    assert s["tokens"] == {
        "prompt": N * PROMPT,
        "output": N * OUTPUT,
        "output_requested": N * OUTPUT,
    }
    assert s["throughput"]["requests_per_s"] == pytest.approx(N / duration)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(N * OUTPUT / duration)
    met = sum(meets_slo(r, SLO(1000, 100)) for r in results)
    assert s["slo"]["met"] == met and s["slo"]["attainment"] == pytest.approx(met / N)
    assert s["slo"]["goodput_rps"] == pytest.approx(met / duration)
    for name in ("ttft", "tpot", "itl", "e2e"):
        row = s["latency_ms"][name]
        assert 0 < row["p50"] <= row["p90"] <= row["p99"]
    ttfts = [r.ttft_s * 1000 for r in results]
    assert s["latency_ms"]["ttft"]["p90"] == pytest.approx(np.percentile(ttfts, 90))
    assert s["config"]["rate"] == 8 and s["config"]["prompt_len"] == str(PROMPT)
    assert (tmp_path / "latency_cdf.png").read_bytes().startswith(PNG)


def test_sweep(base_url, tmp_path):
    assert bench(base_url, tmp_path, "--sweep-rates", "4,16", "--arrivals", "fixed") == 0
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["rate"] for p in sweep["points"]] == [4.0, 16.0]
    assert all(p["failed"] == 0 and p["throughput_rps"] > 0 for p in sweep["points"])
    for rate in ("rate-4", "rate-16"):
        summary = json.loads((tmp_path / rate / "summary.json").read_text())
        assert summary["tokens"]["output"] == N * OUTPUT
        assert (tmp_path / rate / "latency_cdf.png").read_bytes().startswith(PNG)
    assert (tmp_path / "sweep.png").read_bytes().startswith(PNG)


def test_multi_turn_replay_resends_the_history_that_the_engine_has_cached(base_url, tmp_path):
    """Each follow-up turn's prompt is the previous prompt + the reply's token ids + a new
    message, so the engine finds the previous turn's full KV blocks (prompt and generated
    tokens) in its prefix cache: one engine, so every such block is a hit."""
    block = 128  # the CPU engine's KV block
    before = pool_stats("decode")
    code = main(["bench", "--workload", "multi_turn", "--base-url", base_url,
                 "--model", "splitserve-tiny", "--users", "3", "--tenants", "2", "--turns", "3",
                 "--system-len", "300", "--message-len", "40-60", "--reply-len", "20",
                 "--user-rate", "inf", "--think-s", "0", "--seed", "5", "--out", str(tmp_path)])
    assert code == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    turns = [json.loads(line) for line in (tmp_path / "turns.jsonl").read_text().splitlines()]
    assert s["turns"] == len(turns) == 9 and s["failed"] == 0
    assert all(t["ok"] and t["output_tokens"] == 20 for t in turns)
    prev: dict[int, dict] = {}
    must_hit = 0
    for t in turns:  # ordered by (user, turn)
        if t["turn"]:
            p = prev[t["user"]]
            assert t["history_tokens"] == p["prompt_tokens"] + 20
            assert 40 <= t["prompt_tokens"] - t["history_tokens"] <= 60
            must_hit += t["history_tokens"] // block * block
        prev[t["user"]] = t
    assert must_hit > 0
    for _ in range(20):  # the engine's counters follow its steps
        hits = pool_stats("decode").prefix_cache_hits - before.prefix_cache_hits
        if hits >= must_hit:
            break
        time.sleep(0.5)
    assert hits >= must_hit
    assert s["ttft_follow_up_ms"]["mean"] is not None
