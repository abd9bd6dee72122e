"""Tracing configured only by OpenTelemetry's standard environment, end to end on real engines.

The deployment's config says nothing about tracing; the test process sets only `OTEL_*`
variables (as the OpenTelemetry Operator injects them on Kubernetes) before it starts Ray, whose
raylet, and so the router's Serve replica, inherits them. One disaggregated request's spans,
the measured `splitserve.kv_transfer` span included, must arrive at an OTLP/HTTP receiver
(tests/otlp_receiver.py) under the service name of OTEL_SERVICE_NAME.
"""

from __future__ import annotations

import openai
import pytest

from splitserve.config import TracingConfig
from splitserve.router import tracing as tr
from tests.conftest import pool_stats, running_deployment, test_config
from tests.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
ROOT = "POST /v1/completions"
SERVICE = "splitserve-otel-env-e2e"


@pytest.fixture(scope="module")
def deployment():
    cfg = test_config(**{
        "mode": "disaggregated",
        "disaggregation.min_remote_prompt_tokens": 0,  # every prompt goes remote
        "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
    })
    assert cfg.tracing == TracingConfig()  # the config is silent about tracing
    with OtlpReceiver() as rx, pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.base_url)  # the exporter adds /v1/traces
        env.setenv("OTEL_SERVICE_NAME", SERVICE)
        env.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
        env.setenv("OTEL_TRACES_SAMPLER_ARG", "1.0")
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # batch export every 0.2 s (default 5 s)
        with running_deployment(cfg) as base:
            yield base, rx


def _streamed(client: openai.OpenAI, prompt: str) -> str:
    """The response id of one streamed completion, read to its end."""
    rid = ""
    for chunk in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True,
    ):
        rid = chunk.id or rid
    assert rid
    return rid


def test_with_only_otel_variables_a_disaggregated_requests_spans_reach_an_otlp_receiver(
    deployment,
):
    base, rx = deployment
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    _streamed(client, "Warm up the NIXL handshake and the engines. " * 20)

    before = pool_stats("decode")
    rid = _streamed(client, "Every tenant has a key and a fair share. " * 25)
    moved = pool_stats("decode").kv_bytes_received - before.kv_bytes_received
    assert moved > 0

    def trace_of(spans):
        roots = [s for s in spans
                 if s.name == ROOT and s.attributes.get(tr.GENAI_RESPONSE_ID) == rid]
        return [s for s in spans if roots and s.trace_id == roots[0].trace_id]

    # (a loaded machine can hold a batch of spans back for a while: wait up to 3 min)
    spans = trace_of(rx.wait_for(lambda got: len(trace_of(got)) >= 8, timeout_s=180))
    names = sorted(s.name for s in spans)
    assert names == sorted([ROOT, tr.DISPATCH, tr.PREFILL, tr.PREFILL_ATTEMPT, tr.ADMISSION,
                            tr.ADMISSION, tr.DECODE, tr.KV_TRANSFER]), names
    assert set(rx.paths) == {"/v1/traces"}
    assert {s.resource["service.name"] for s in spans} == {SERVICE}
    assert {s.scope for s in spans} == {"splitserve.router"}

    by_name = {s.name: s for s in spans}
    assert by_name[tr.DISPATCH].attributes[tr.PREFILL_PATH] == "remote"
    kv, decode = by_name[tr.KV_TRANSFER], by_name[tr.DECODE]
    assert kv.parent_id == decode.span_id
    assert kv.attributes[tr.KV_BYTES] == moved == decode.attributes[tr.KV_BYTES]
    assert kv.attributes[tr.KV_SECONDS] > 0 and kv.attributes[tr.KV_BLOCKS] > 0
