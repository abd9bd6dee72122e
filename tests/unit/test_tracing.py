"""OpenTelemetry tracing of one request (router/tracing.py): the span tree, W3C trace context,
sampling, the off path, prefill failures, and a streamed root span that ends with its stream.

No Ray cluster: the pool handles are scripted fakes (router_fakes.py); the gates, tenancy,
dispatcher and the Router's own request methods (on an instance built without its Serve
constructor) are real.
Spans go to an `InMemorySpanExporter` on a provider of the test's own (no global provider).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN, SpanKind, StatusCode

from splitserve.config import parse_config
from splitserve.engine.messages import (
    KV_EXPIRED,
    KV_TRANSFER_ERROR,
    GenerateRequest,
    Sampling,
    WorkerError,
)
from splitserve.router import tracing as tr
from splitserve.router.dispatch import Dispatcher
from splitserve.router.errors import APIError
from splitserve.router.metrics import RouterMetrics
from splitserve.router.tenancy import DEFAULT_TENANT, Tenancy

from router_fakes import (
    DECODE_OK,
    KV_BYTES,
    KV_SECONDS,
    PREFILL_OK,
    Pool,
    build_router,
    completion_body,
    config,
    drain,
    http_request,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list]:
    spans: dict[str, list] = {}
    for span in exporter.get_finished_spans():
        spans.setdefault(span.name, []).append(span)
    return spans


def _one(spans: dict[str, list], name: str):
    assert len(spans.get(name, [])) == 1, (name, spans.keys())
    return spans[name][0]


def _parent_of(span) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_a_disaggregated_stream_is_one_trace_ending_with_its_stream():
    decode_pool = Pool(DECODE_OK)

    async def run():
        exporter = InMemorySpanExporter()
        router = build_router(config(), Pool(PREFILL_OK), decode_pool, exporter)
        response = await router._serve("completions", http_request(completion_body()))
        assert response.status_code == 200
        # The handler has returned the StreamingResponse: the root span is still open.
        assert "POST /v1/completions" not in _by_name(exporter)
        events = await drain(response)
        assert events[-1] == b"data: [DONE]\n\n"
        return _by_name(exporter)

    spans = asyncio.run(run())
    root = _one(spans, "POST /v1/completions")
    dispatch, prefill = _one(spans, tr.DISPATCH), _one(spans, tr.PREFILL)
    attempt, decode = _one(spans, tr.PREFILL_ATTEMPT), _one(spans, tr.DECODE)
    gates = {s.attributes[tr.POOL]: s for s in spans[tr.ADMISSION]}
    assert sorted(gates) == ["decode", "prefill"]

    assert root.kind is SpanKind.SERVER and root.parent is None
    assert {s.context.trace_id for ss in spans.values() for s in ss} == {root.context.trace_id}
    assert _parent_of(dispatch) == root.context.span_id
    assert _parent_of(prefill) == dispatch.context.span_id
    assert _parent_of(gates["prefill"]) == prefill.context.span_id
    assert _parent_of(attempt) == prefill.context.span_id
    assert _parent_of(gates["decode"]) == dispatch.context.span_id
    assert _parent_of(decode) == dispatch.context.span_id
    assert root.end_time >= max(s.end_time for ss in spans.values() for s in ss)

    assert root.attributes[tr.HTTP_STATUS] == 200
    assert root.attributes[tr.TENANT] == "default"
    assert root.attributes[tr.GENAI_MODEL] == "splitserve-tiny"
    assert root.attributes[tr.GENAI_INPUT_TOKENS] == 300
    assert root.attributes[tr.GENAI_OUTPUT_TOKENS] == 2
    assert root.attributes[tr.GENAI_MAX_TOKENS] == 2
    assert root.attributes[tr.GENAI_RESPONSE_ID] == "cmpl-" + decode_pool.requests[0].request_id
    assert root.status.status_code is StatusCode.UNSET
    assert dispatch.attributes[tr.PREFILL_PATH] == "remote"
    assert dispatch.attributes[tr.FALLBACK] is False
    assert attempt.attributes[tr.ATTEMPT] == 1
    assert attempt.attributes[tr.REPLICA] == "prefill-0"
    assert prefill.attributes[tr.PREFILL_ATTEMPTS] == 1
    assert tr.QUEUE_WAIT in gates["decode"].attributes
    assert decode.attributes[tr.KV_BYTES] == KV_BYTES  # what the decode worker reported
    assert decode.attributes[tr.CACHED_TOKENS] == 288
    assert decode.attributes[tr.GENAI_OUTPUT_TOKENS] == 2
    assert decode.attributes[tr.REPLICA] == "decode-0"
    assert decode.attributes[tr.PREFILL_REMOTE] is True
    assert [e.name for e in decode.events] == [tr.FIRST_TOKEN]
    assert all(s.status.status_code is not StatusCode.ERROR for ss in spans.values() for s in ss)

    # The measured KV pull: a child of the decode hop, ending at its first token and lasting
    # what the connector measured.
    kv = _one(spans, tr.KV_TRANSFER)
    assert _parent_of(kv) == decode.context.span_id
    assert dict(kv.attributes) == {
        tr.KV_BYTES: KV_BYTES, tr.KV_BLOCKS: 2, tr.KV_BACKEND: "nixl", tr.KV_SECONDS: KV_SECONDS,
    }
    assert kv.end_time == decode.events[0].timestamp
    assert kv.end_time - kv.start_time == round(KV_SECONDS * 1e9)


def test_no_measured_transfer_no_kv_transfer_span_and_the_duration_metric_counts_per_request():
    unmeasured = [dataclasses.replace(c, kv_transfer_s=None) for c in DECODE_OK]

    async def run(decode_chunks):
        exporter = InMemorySpanExporter()
        router = build_router(config(), Pool(PREFILL_OK), Pool(decode_chunks), exporter)
        await drain(await router._serve("completions", http_request(completion_body())))
        registry = router.dispatcher.metrics.registry
        count = registry.get_sample_value("splitserve_kv_transfer_duration_seconds_count")
        total = registry.get_sample_value("splitserve_kv_transfer_duration_seconds_sum")
        return _by_name(exporter), count, total

    spans, count, total = asyncio.run(run(unmeasured))
    assert tr.KV_TRANSFER not in spans and count == 0
    assert _one(spans, tr.DECODE).attributes[tr.KV_BYTES] == KV_BYTES  # the computed bytes
    spans, count, total = asyncio.run(run(DECODE_OK))
    assert (count, total) == (1, pytest.approx(KV_SECONDS))
    assert tr.KV_TRANSFER in spans


@pytest.mark.parametrize(("reason", "measured_s"), [
    (KV_TRANSFER_ERROR, None),  # the pull failed before anything moved
    (KV_TRANSFER_ERROR, KV_SECONDS),  # one rank's transfer completed, another's failed
    (KV_EXPIRED, None),  # the handoff expired before the decode engine saw it
])
def test_a_recomputed_handoff_gives_a_failed_kv_transfer_span(reason, measured_s):
    recomputed = [*DECODE_OK[:-1], dataclasses.replace(
        DECODE_OK[-1], kv_bytes=0, kv_transfer_s=measured_s, kv_recomputed=reason)]

    async def run():
        exporter = InMemorySpanExporter()
        router = build_router(config(), Pool(PREFILL_OK), Pool(recomputed), exporter)
        response = await router._serve("completions", http_request(completion_body()))
        assert response.status_code == 200
        await drain(response)
        return _by_name(exporter)

    spans = asyncio.run(run())
    decode, kv = _one(spans, tr.DECODE), _one(spans, tr.KV_TRANSFER)
    assert _parent_of(kv) == decode.context.span_id
    assert kv.status.status_code is StatusCode.ERROR and reason in kv.status.description
    assert kv.attributes[tr.KV_RECOMPUTED] is True
    assert kv.attributes[tr.ERROR_TYPE] == reason
    assert (kv.attributes[tr.KV_BYTES], kv.attributes[tr.KV_BLOCKS]) == (0, 2)
    assert kv.attributes.get(tr.KV_SECONDS) == measured_s
    (event,) = kv.events
    assert (event.name, dict(event.attributes)) == (tr.KV_FAILED, {"reason": reason})
    assert kv.end_time == event.timestamp == decode.events[0].timestamp  # at the first token
    assert kv.end_time - kv.start_time == round((measured_s or 0) * 1e9)
    # the request itself succeeded: only the KV span failed
    others = [s for ss in spans.values() for s in ss if s is not kv]
    assert all(s.status.status_code is not StatusCode.ERROR for s in others)


def test_spans_go_to_a_json_lines_file_when_configured(tmp_path):
    from splitserve.router.span_file import read_spans

    path = tmp_path / "spans.jsonl"

    async def run():
        cfg = config({"enabled": True, "file": str(path)})
        router = build_router(cfg, Pool(PREFILL_OK), Pool(DECODE_OK), None)
        await drain(await router._serve("completions", http_request(completion_body())))
        router.tracing.shutdown()

    asyncio.run(run())
    spans = {s["name"]: s for s in read_spans(str(path))}
    root, decode, kv = spans["POST /v1/completions"], spans[tr.DECODE], spans[tr.KV_TRANSFER]
    assert root["parent_id"] is None and root["kind"] == "SERVER"
    assert {s["trace_id"] for s in spans.values()} == {root["trace_id"]}
    assert kv["parent_id"] == decode["span_id"]
    assert spans[tr.DISPATCH]["parent_id"] == root["span_id"]
    assert kv["attributes"][tr.KV_BYTES] == KV_BYTES
    assert kv["end_ns"] == decode["events"][0]["time_ns"]
    assert root["attributes"][tr.HTTP_STATUS] == 200


def test_an_incoming_traceparent_is_the_root_spans_parent():
    async def run():
        exporter = InMemorySpanExporter()
        router = build_router(config(), Pool(PREFILL_OK), Pool(DECODE_OK), exporter)
        headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        request = http_request(completion_body(stream=False), headers)
        response = await router._serve("completions", request)
        assert response.status_code == 200
        return _by_name(exporter)

    spans = asyncio.run(run())
    root = _one(spans, "POST /v1/completions")
    assert root.context.trace_id == int(TRACE_ID, 16)
    assert root.parent.span_id == int(PARENT_ID, 16) and root.parent.is_remote
    assert _one(spans, tr.DECODE).context.trace_id == int(TRACE_ID, 16)
    assert root.attributes[tr.STREAM] is False


@pytest.mark.parametrize(
    ("tracing", "headers"),
    [({"enabled": True, "sample_ratio": 0.0}, {}),
     ({"enabled": True}, {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"}),  # caller: not sampled
     ({"enabled": False}, {})],
)
def test_unsampled_or_disabled_records_nothing_and_serves_the_same(tracing, headers):
    async def run():
        exporter = InMemorySpanExporter()
        prefill, decode = Pool(PREFILL_OK), Pool(DECODE_OK)
        router = build_router(config(tracing), prefill, decode, exporter)
        response = await router._serve("completions", http_request(completion_body(), headers))
        events = await drain(response)
        assert len(prefill.requests) == len(decode.requests) == 1
        return exporter.get_finished_spans(), events

    spans, events = asyncio.run(run())
    assert spans == ()
    assert events[-1] == b"data: [DONE]\n\n"


def test_the_off_path_makes_no_provider_and_no_span_objects():
    exporter = InMemorySpanExporter()
    off = tr.Tracing.from_config(config({"enabled": False}).tracing, exporter=exporter)
    assert off is tr.NOOP_TRACING and off.provider is None and not off.enabled
    assert off.start(tr.DISPATCH, None) is INVALID_SPAN
    assert off.context_of(INVALID_SPAN) is None
    assert off.request("chat", {}, model="m") is tr.NOOP_REQUEST
    chunks = Pool(DECODE_OK).run(DECODE_OK)
    assert tr.NOOP_REQUEST.stream(chunks) is chunks
    tenancy = Tenancy.from_config(config())
    assert type(off.admit(tenancy, "decode", DEFAULT_TENANT, 1, None)) is type(
        tenancy.admit("decode", DEFAULT_TENANT, 1)
    )


def test_the_dispatcher_without_tracing_streams_unchanged():
    async def run():
        cfg = config({"enabled": False})
        d = Dispatcher(
            {"prefill": Pool(PREFILL_OK), "decode": Pool(DECODE_OK)}, cfg.disaggregation,
            RouterMetrics(), Tenancy.from_config(cfg), replicas={"prefill": 1, "decode": 1},
        )
        assert d.tracing is tr.NOOP_TRACING
        req = GenerateRequest("cmpl-1", tuple(range(300)), Sampling(max_tokens=2))
        return [c async for c in d.stream(req, DEFAULT_TENANT)], d

    chunks, d = asyncio.run(run())
    assert chunks == DECODE_OK
    assert d.pools["decode"].requests[0].kv_transfer_params is not None  # prefilled remotely


def test_a_failed_prefill_then_local_fallback_shows_the_failed_try():
    async def run():
        exporter = InMemorySpanExporter()
        cfg = config(prefill_attempts=1)
        prefill = Pool(WorkerError("prefill-bad", "engine error"))
        router = build_router(cfg, prefill, Pool(DECODE_OK), exporter)
        response = await router._serve("completions", http_request(completion_body()))
        await drain(response)
        return _by_name(exporter)

    spans = asyncio.run(run())
    attempt, prefill = _one(spans, tr.PREFILL_ATTEMPT), _one(spans, tr.PREFILL)
    assert attempt.status.status_code is StatusCode.ERROR
    assert attempt.attributes[tr.ERROR_TYPE] == "replica"
    assert attempt.attributes[tr.REPLICA] == "prefill-bad"
    assert [e.name for e in attempt.events] == ["exception"]
    assert prefill.attributes[tr.FALLBACK] is True
    assert prefill.attributes[tr.FALLBACK_REASON] == "prefill_failed"
    assert _one(spans, tr.DISPATCH).attributes[tr.FALLBACK] is True
    assert _one(spans, tr.DECODE).attributes[tr.PREFILL_REMOTE] is False
    root = _one(spans, "POST /v1/completions")
    assert root.status.status_code is StatusCode.UNSET  # the client got its answer
    assert root.attributes[tr.HTTP_STATUS] == 200


def test_a_retried_prefill_has_one_span_per_try():
    async def run():
        exporter = InMemorySpanExporter()
        cfg = config(prefill_attempts=2)
        prefill = Pool(WorkerError("prefill-bad", "engine error"), PREFILL_OK)
        router = build_router(cfg, prefill, Pool(DECODE_OK), exporter)
        await drain(await router._serve("completions", http_request(completion_body())))
        return _by_name(exporter)

    spans = asyncio.run(run())
    tries = sorted(spans[tr.PREFILL_ATTEMPT], key=lambda s: s.attributes[tr.ATTEMPT])
    assert [s.status.status_code for s in tries] == [StatusCode.ERROR, StatusCode.UNSET]
    assert tries[1].attributes[tr.REQUEST_ID].endswith("-prefill-2")
    prefill = _one(spans, tr.PREFILL)
    assert prefill.attributes[tr.PREFILL_ATTEMPTS] == 2 and tr.FALLBACK not in prefill.attributes
    assert _one(spans, tr.DECODE).attributes[tr.PREFILL_REMOTE] is True


def test_a_client_that_walks_away_ends_the_root_span_as_cancelled():
    async def run():
        exporter = InMemorySpanExporter()
        decode = Pool(DECODE_OK)
        router = build_router(config(), Pool(PREFILL_OK), decode, exporter)
        response = await router._serve("completions", http_request(completion_body()))
        body = response.body_iterator
        await anext(body)  # the first event went out; then the client is gone
        await body.aclose()
        assert "POST /v1/completions" in _by_name(exporter)
        # The dispatcher's stream is closed by the event loop's async-generator finalizer.
        await asyncio.sleep(0.01)
        return _by_name(exporter)

    spans = asyncio.run(run())
    root = _one(spans, "POST /v1/completions")
    assert root.attributes[tr.CANCELLED] is True
    assert root.status.status_code is StatusCode.UNSET
    decode = _one(spans, tr.DECODE)
    assert decode.attributes[tr.CANCELLED] is True
    assert decode.attributes[tr.GENAI_OUTPUT_TOKENS] == 1


def test_a_response_whose_body_never_starts_ends_the_root_span_in_its_background_task():
    async def run():
        exporter = InMemorySpanExporter()
        router = build_router(config(), Pool(PREFILL_OK), Pool(DECODE_OK), exporter)
        response = await router._serve("completions", http_request(completion_body()))
        assert "POST /v1/completions" not in _by_name(exporter)
        await response.background()
        assert "POST /v1/completions" in _by_name(exporter)
        await asyncio.sleep(0.01)  # the dispatcher's stream: closed by the loop's finalizer
        return _by_name(exporter)

    spans = asyncio.run(run())
    assert _one(spans, "POST /v1/completions").attributes[tr.CANCELLED] is True
    assert _one(spans, tr.DISPATCH).end_time is not None


def test_client_errors_leave_the_status_unset_and_server_errors_set_it():
    async def run(body, decode):
        exporter = InMemorySpanExporter()
        router = build_router(config(), Pool(PREFILL_OK), decode, exporter)
        response = await router._serve("completions", http_request(body))
        return response.status_code, _by_name(exporter)

    status, spans = asyncio.run(run({"model": "other", "prompt": "x"}, Pool(DECODE_OK)))
    root = _one(spans, "POST /v1/completions")
    assert status == root.attributes[tr.HTTP_STATUS] == 404
    assert root.status.status_code is StatusCode.UNSET and tr.ERROR_TYPE in root.attributes
    assert tr.DISPATCH not in spans

    status, spans = asyncio.run(run(completion_body(), Pool(RuntimeError("engine died"))))
    root = _one(spans, "POST /v1/completions")
    assert status == root.attributes[tr.HTTP_STATUS] == 500
    assert root.status.status_code is StatusCode.ERROR
    # the failed decode hop, then its continuation on another replica (router.decode_migrations
    # = 1) failing the same way: one span each, the second marked as the first migration
    hops = spans[tr.DECODE]
    assert [h.status.status_code for h in hops] == [StatusCode.ERROR, StatusCode.ERROR]
    assert [h.attributes.get(tr.MIGRATION) for h in hops] == [None, 1]
    assert _one(spans, tr.DISPATCH).status.status_code is StatusCode.ERROR


def test_a_full_decode_queue_is_an_admission_span_with_its_reason():
    async def run():
        exporter = InMemorySpanExporter()
        cfg = parse_config({
            "mode": "colocated", "tracing": {"enabled": True},
            "tenancy": {"decode_max_in_flight": 1, "max_queued": 1},
        })
        tracing = tr.Tracing.from_config(cfg.tracing, exporter=exporter)
        decode = Pool(DECODE_OK)
        d = Dispatcher({"decode": decode}, cfg.disaggregation, RouterMetrics(),
                       Tenancy.from_config(cfg), tracing=tracing)
        req = GenerateRequest("cmpl-1", (1, 2, 3), Sampling(max_tokens=2))
        holder = d.stream(req, DEFAULT_TENANT)
        await anext(holder)  # holds the only slot
        waiting = d.stream(req, DEFAULT_TENANT)
        waiter = asyncio.create_task(anext(waiting))
        await asyncio.sleep(0.01)  # queued
        with pytest.raises(APIError) as refused:
            await anext(d.stream(req, DEFAULT_TENANT))
        assert refused.value.status == 429
        await holder.aclose()
        await waiter
        await waiting.aclose()
        return _by_name(exporter)

    spans = asyncio.run(run())
    assert [s.attributes[tr.PREFILL_PATH] for s in spans[tr.DISPATCH]] == ["colocated"] * 3
    failed = [s for s in spans[tr.ADMISSION] if s.status.status_code is StatusCode.ERROR]
    assert [s.attributes[tr.ERROR_TYPE] for s in failed] == ["queue_full"]
    assert len(spans[tr.ADMISSION]) == 3


def test_config_bounds_and_the_otlp_exporter_is_wired_without_a_global_provider():
    from opentelemetry import trace as otel_trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from splitserve.config import ConfigError

    with pytest.raises(ConfigError, match="tracing.sample_ratio"):
        parse_config({"tracing": {"sample_ratio": 1.5}})
    with pytest.raises(ConfigError, match="tracing.endpoint: unknown key"):
        parse_config({"tracing": {"endpoint": "x"}})
    cfg = parse_config({"tracing": {
        "enabled": True, "otlp_endpoint": "http://127.0.0.1:9/v1/traces", "service_name": "r1",
    }}).tracing
    tracing = tr.Tracing.from_config(cfg)
    try:
        processors = tracing.provider._active_span_processor._span_processors
        assert [type(p) for p in processors] == [BatchSpanProcessor]
        assert isinstance(processors[0].span_exporter, OTLPSpanExporter)
        assert tracing.provider.resource.attributes["service.name"] == "r1"
        assert otel_trace.get_tracer_provider() is not tracing.provider
    finally:
        tracing.shutdown()


def test_a_chat_request_span_is_named_for_its_route():
    exporter = InMemorySpanExporter()
    tracing = tr.Tracing.from_config(config().tracing, exporter=exporter)
    request = tracing.request("chat", {}, model="m")
    request.describe(tenant=DEFAULT_TENANT)
    request.answered(200)
    (span,) = exporter.get_finished_spans()
    assert span.name == "POST /v1/chat/completions"
    assert span.attributes[tr.GENAI_OPERATION] == "chat"
    assert span.attributes[tr.HTTP_ROUTE] == "/v1/chat/completions"
    assert span.attributes[tr.HTTP_STATUS] == 200


def test_a_directly_served_request_is_one_trace_ending_at_its_settlement():
    """Direct streaming: the root span starts at HAProxy's route call, the dispatch and the
    remote prefill are its children, and it ends with the replica's settlement (or as failed
    when none comes)."""
    from splitserve.engine.routed import Settlement
    from splitserve.router import direct

    cfg = config()
    cfg = cfg.model_copy(update={"router": cfg.router.model_copy(
        update={"direct_ingress": True, "direct_streaming": True})})
    body = json.dumps(completion_body()).encode()
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}

    async def run():
        exporter = InMemorySpanExporter()
        router = build_router(cfg, Pool(PREFILL_OK), Pool([]), exporter)
        router.leases = direct.Leases()
        served, handoff = await router._route_verdict(headers, body, "http://127.0.0.1:1")
        router.dispatcher.release(handoff.reservation)
        assert "POST /v1/completions" not in _by_name(exporter)  # open until settled
        await direct.settle(router.leases.take(served.ticket), Settlement(
            served.ticket, output_tokens=2, first_token_s=0.01, decode_s=0.01))
        lost, handoff = await router._route_verdict(headers, body, "http://127.0.0.1:1")
        router.dispatcher.release(handoff.reservation)
        await direct.settle(router.leases.take(lost.ticket), None)
        return served, _by_name(exporter)

    served, spans = asyncio.run(run())
    ok, failed = spans["POST /v1/completions"]
    assert {s.context.trace_id for ss in spans.values() for s in ss} == {int(TRACE_ID, 16)}
    assert _parent_of(ok) == int(PARENT_ID, 16)
    dispatch = spans[tr.DISPATCH][0]
    assert _parent_of(dispatch) == ok.context.span_id
    assert _parent_of(spans[tr.PREFILL][0]) == dispatch.context.span_id
    assert ok.attributes[tr.HTTP_STATUS] == 200 and ok.attributes[tr.GENAI_OUTPUT_TOKENS] == 2
    assert ok.attributes[tr.GENAI_RESPONSE_ID] == "cmpl-" + served.request_id
    assert ok.status.status_code is StatusCode.UNSET
    assert failed.attributes[tr.HTTP_STATUS] == 502
    assert failed.status.status_code is StatusCode.ERROR
    assert "never settled" in failed.status.description
