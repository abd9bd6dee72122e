"""scripts/bench_disagg.py: reading the router's /metrics into per-rate decisions and TTFT parts.

The text is what a real `RouterMetrics` registry exposes; only the HTTP GET is replaced.
"""

from __future__ import annotations

import httpx
import pytest
from splitserve.router.metrics import RouterMetrics

from tests.scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_disagg")


def serve_metrics(monkeypatch, metrics: RouterMetrics) -> None:
    def get(url, timeout):
        assert url.endswith("/metrics")
        return httpx.Response(200, content=metrics.render())

    monkeypatch.setattr(httpx, "get", get)


def test_rate_figures_split_ttft_into_router_pool_and_engine(bench, monkeypatch):
    m = RouterMetrics()
    serve_metrics(monkeypatch, m)
    before = bench.router_counters("http://127.0.0.1:1")
    for ttft, pool_ttft, engine_ttft in ((0.5, 0.3, 0.1), (0.7, 0.5, 0.3)):
        m.observe_generation(tenant="default", ttft=ttft, e2e=2.0, prompt_tokens=8,
                             output_tokens=4)
        m.pool_first_token("decode", pool_ttft)
        m.engine_ttft.labels(pool="decode", hop="generate").observe(engine_ttft)
    m.engine_ttft.labels(pool="prefill", hop="prefill").observe(9.0)  # a remote prefill's hop
    m.disagg_reasons.labels(reason="offload").inc(3)
    decisions, parts = bench.rate_figures(bench.router_counters("http://127.0.0.1:1") - before)
    assert decisions == {"offload": 3}
    assert parts["router"] == {"requests": 2, "router_ttft_mean_ms": 600.0}
    assert parts["decode"] == {"requests": 2, "pool_ttft_mean_ms": 400.0,
                               "engine_ttft_mean_ms": 200.0}
    assert "prefill" not in parts  # it generated no request's first token


def test_prediction_figures_give_the_median_ratio_and_the_share_within_25pct(bench,
                                                                             monkeypatch):
    m = RouterMetrics()
    serve_metrics(monkeypatch, m)
    before = bench.router_counters("http://127.0.0.1:1")
    for ratio in (0.95, 1.05, 1.05, 1.2, 3.0):
        m.ttft_prediction.labels(path="remote").observe(ratio)
    m.ttft_prediction.labels(path="local").observe(0.5)
    got = bench.prediction_figures(bench.router_counters("http://127.0.0.1:1") - before)
    assert got["remote"]["requests"] == 5 and got["remote"]["within_25pct"] == 0.8
    assert 1.0 <= got["remote"]["median_ratio"] <= 1.1
    assert got["local"]["requests"] == 1 and got["local"]["within_25pct"] == 0.0
    assert 0 < got["local"]["median_ratio"] <= 0.5  # inside its bucket


def test_set_values_read_as_yaml_env_values_kept_as_strings(bench):
    args = bench.parse_args(["--set", "pools.decode.max_num_seqs=128", "--set", "a.b=off",
                             "--env", "SPLITSERVE_MQ_WAIT_MS=2", "--env", "X=a=b"])
    assert args.set == {"pools.decode.max_num_seqs": 128, "a.b": False}
    assert args.env == {"SPLITSERVE_MQ_WAIT_MS": "2", "X": "a=b"}


@pytest.mark.parametrize("flag", ["--set", "--env"])
def test_a_pair_without_a_key_is_a_usage_error(bench, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args([flag, "=2"])
    assert exc.value.code == 2
    assert f"{flag} '=2': expected KEY=VALUE" in capsys.readouterr().err


def test_colocated_nixl_engines_carry_the_connector_only_while_deployed(bench):
    from splitserve import app
    from splitserve.config import load_config

    cfg = load_config(None).with_overrides(**bench.CONFIGS["colocated-nixl"])
    assert "colocated-nixl" in bench.WITH_CONNECTOR and "colocated" not in bench.WITH_CONNECTOR
    assert not app.engine_spec(cfg, "decode", "cpu").kv_transfer  # colocated: no connector
    with bench.connector_everywhere(True):
        spec = app.engine_spec(cfg, "decode", "cpu", kv_host="127.0.0.1")
        assert spec.kv_transfer and spec.kv_host == "127.0.0.1"
    assert not app.engine_spec(cfg, "decode", "cpu").kv_transfer  # restored
    with bench.connector_everywhere(False):
        assert not app.engine_spec(cfg, "decode", "cpu").kv_transfer
