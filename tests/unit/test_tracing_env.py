"""Tracing configured by OpenTelemetry's standard environment (router/tracing.py,
`Tracing.from_config`): each `tracing` key left out (null) is taken from the OTEL_* variables,
a key given in the config wins, and OTEL_SDK_DISABLED=true turns tracing off.

Every test starts from an environment without any OTEL_* variable (tests/unit/conftest.py). The
last test sends a disaggregated request through the router (fake pools, router_fakes.py) with
only OTEL_* variables set and reads its spans, the KV transfer's included, back from an OTLP/HTTP
receiver.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from splitserve.config import TracingConfig, parse_config
from splitserve.router import tracing as tr
from tests.otlp_receiver import OtlpReceiver

from router_fakes import (
    DECODE_OK,
    KV_BYTES,
    PREFILL_OK,
    Pool,
    build_router,
    completion_body,
    drain,
    http_request,
)
from router_fakes import config as disagg_config

ENDPOINT = "http://collector.example:4318"


def _tracing(tracing: dict | None = None) -> tr.Tracing:
    return tr.Tracing.from_config(parse_config({"tracing": tracing or {}}).tracing)


def _exporters(tracing: tr.Tracing) -> list:
    processors = tracing.provider._active_span_processor._span_processors
    return [p.span_exporter for p in processors if isinstance(p, BatchSpanProcessor)]


def _sampler(tracing: tr.Tracing) -> str:
    return tracing.provider.sampler.get_description()


def test_a_config_without_tracing_keys_leaves_them_null_through_a_round_trip():
    cfg = parse_config({})
    assert cfg.tracing == TracingConfig()
    assert (cfg.tracing.enabled, cfg.tracing.sample_ratio, cfg.tracing.service_name) == (
        None, None, None)
    # a dump and re-parse (with_overrides, the Serve app args) keeps "not said" as null
    again = cfg.with_overrides(**{"router.port": 9000})
    assert again.tracing == cfg.tracing
    with pytest.raises(Exception, match="tracing.service_name"):
        parse_config({"tracing": {"service_name": ""}})


def test_silent_config_and_no_otel_endpoint_is_off(monkeypatch):
    assert _tracing() is tr.NOOP_TRACING
    monkeypatch.setenv("OTEL_SERVICE_NAME", "svc")  # other variables alone do not turn it on
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    assert _tracing() is tr.NOOP_TRACING


@pytest.mark.parametrize(("env", "url"), [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, f"{ENDPOINT}/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{ENDPOINT}/custom"}, f"{ENDPOINT}/custom"),
    # the signal-specific variable wins over the generic one, used as is
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4318",
      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{ENDPOINT}/v1/traces"}, f"{ENDPOINT}/v1/traces"),
])
def test_an_otel_endpoint_turns_tracing_on_and_exports_there_over_http(monkeypatch, env, url):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    tracing = _tracing()
    try:
        assert tracing.enabled
        (exporter,) = _exporters(tracing)
        assert isinstance(exporter, OTLPSpanExporter)
        assert exporter._endpoint == url
        # defaults: every trace (parentbased_always_on), service.name splitserve-router
        assert _sampler(tracing).startswith("ParentBased{root:AlwaysOnSampler")
        assert tracing.provider.resource.attributes["service.name"] == tr.DEFAULT_SERVICE_NAME
    finally:
        tracing.shutdown()


def test_the_config_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    # enabled: false beats an endpoint in the environment
    assert _tracing({"enabled": False}) is tr.NOOP_TRACING
    tracing = _tracing({
        "otlp_endpoint": "http://127.0.0.1:9/v1/traces", "service_name": "from-config",
        "sample_ratio": 0.5,
    })
    try:
        (exporter,) = _exporters(tracing)
        assert exporter._endpoint == "http://127.0.0.1:9/v1/traces"
        assert tracing.provider.resource.attributes["service.name"] == "from-config"
        assert _sampler(tracing).startswith("ParentBased{root:TraceIdRatioBased{0.5}")
    finally:
        tracing.shutdown()


def test_a_config_endpoint_alone_turns_tracing_on_and_enabled_alone_records_without_export():
    tracing = _tracing({"otlp_endpoint": "http://127.0.0.1:9/v1/traces"})
    try:
        assert tracing.enabled and len(_exporters(tracing)) == 1
    finally:
        tracing.shutdown()
    tracing = _tracing({"enabled": True})  # no endpoint anywhere: record, export nothing
    assert tracing.enabled and _exporters(tracing) == []  # (no default localhost exporter)


@pytest.mark.parametrize("value", ["true", "TRUE", " True "])
def test_otel_sdk_disabled_turns_tracing_off_even_when_the_config_enables_it(
    monkeypatch, caplog, value
):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    monkeypatch.setenv("OTEL_SDK_DISABLED", value)
    assert _tracing() is tr.NOOP_TRACING
    with caplog.at_level(logging.WARNING, logger=tr.__name__):
        assert _tracing({"enabled": True}) is tr.NOOP_TRACING
    assert "OTEL_SDK_DISABLED" in caplog.text


def test_otel_sdk_disabled_false_changes_nothing(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "false")
    tracing = _tracing()
    assert tracing.enabled
    tracing.shutdown()


@pytest.mark.parametrize(("sampler", "arg", "description", "records"), [
    ("traceidratio", "0.25", "TraceIdRatioBased{0.25}", None),
    ("parentbased_traceidratio", "0.25", "ParentBased{root:TraceIdRatioBased{0.25}", None),
    ("always_off", None, "AlwaysOffSampler", False),
    ("parentbased_always_off", None, "ParentBased{root:AlwaysOffSampler", False),
    ("always_on", None, "AlwaysOnSampler", True),
])
def test_the_sampler_comes_from_otel_traces_sampler(monkeypatch, sampler, arg, description,
                                                    records):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if arg is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    tracing = _tracing()
    try:
        assert _sampler(tracing).startswith(description)
        if records is not None:
            trace = tracing.request("completions", {}, model="m")
            assert isinstance(trace, tr.RequestTrace) is records
    finally:
        tracing.shutdown()


@pytest.mark.parametrize(("env", "name"), [
    ({"OTEL_SERVICE_NAME": "router-a"}, "router-a"),
    ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=router-b,deployment.environment=prod"},
     "router-b"),
    # OTEL_SERVICE_NAME beats a service.name in OTEL_RESOURCE_ATTRIBUTES (the spec's rule)
    ({"OTEL_SERVICE_NAME": "router-a", "OTEL_RESOURCE_ATTRIBUTES": "service.name=router-b"},
     "router-a"),
    ({"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod"}, tr.DEFAULT_SERVICE_NAME),
])
def test_the_service_name_and_resource_come_from_the_environment(monkeypatch, env, name):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    tracing = _tracing()
    try:
        attrs = tracing.provider.resource.attributes
        assert attrs["service.name"] == name
        if "deployment.environment" in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
            assert attrs["deployment.environment"] == "prod"
    finally:
        tracing.shutdown()


def test_the_otlp_protocol_variable_picks_grpc_and_http_json_falls_back_to_http(
    monkeypatch, caplog
):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    tracing = _tracing()
    assert [type(e) for e in _exporters(tracing)] == [GrpcSpanExporter]
    tracing.shutdown()
    # the signal-specific variable wins
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with caplog.at_level(logging.WARNING, logger=tr.__name__):
        tracing = _tracing()
    assert [type(e) for e in _exporters(tracing)] == [OTLPSpanExporter]
    assert "http/json" in caplog.text
    tracing.shutdown()
    # a config endpoint is OTLP/HTTP whatever the protocol variables say
    tracing = _tracing({"otlp_endpoint": "http://127.0.0.1:9/v1/traces"})
    assert [type(e) for e in _exporters(tracing)] == [OTLPSpanExporter]
    tracing.shutdown()


def test_with_only_otel_variables_a_disaggregated_requests_spans_reach_an_otlp_receiver(
    monkeypatch,
):
    with OtlpReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.base_url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "splitserve-test")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1.0")
        cfg = disagg_config(tracing={})  # the config says nothing about tracing

        async def run():
            router = build_router(cfg, Pool(PREFILL_OK), Pool(DECODE_OK))
            assert router.tracing.enabled
            response = await router._serve("completions", http_request(completion_body()))
            assert response.status_code == 200
            await drain(response)
            router.tracing.shutdown()  # flushes the batch processor

        asyncio.run(run())
        spans = rx.wait_for(lambda s: len(s) >= 8, timeout_s=10)
    assert set(rx.paths) == {"/v1/traces"}
    names = sorted(s.name for s in spans)
    assert names == sorted([
        "POST /v1/completions", tr.DISPATCH, tr.PREFILL, tr.PREFILL_ATTEMPT, tr.ADMISSION,
        tr.ADMISSION, tr.DECODE, tr.KV_TRANSFER,
    ])
    assert len({s.trace_id for s in spans}) == 1
    assert {s.resource["service.name"] for s in spans} == {"splitserve-test"}
    (kv,) = [s for s in spans if s.name == tr.KV_TRANSFER]
    (decode,) = [s for s in spans if s.name == tr.DECODE]
    assert kv.parent_id == decode.span_id
    assert kv.attributes[tr.KV_BYTES] == KV_BYTES
