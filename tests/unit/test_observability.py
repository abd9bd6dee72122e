"""Metrics and request logs of the router's real request path (router/metrics.py,
router/request_log.py, router/pool_metrics.py), `splitserve top`'s parsing and drawing, and the
controller's metrics.

No Ray: the pools are scripted fakes (router_fakes.py); `/metrics` is the Router's own endpoint
method, its text parsed with prometheus_client's parser.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from splitserve import top
from splitserve.config import parse_config
from splitserve.controller.metrics import ControllerMetrics, action_of
from splitserve.engine.messages import KV_EXPIRED, KV_TRANSFER_ERROR, WorkerError
from splitserve.engine.routed import Settlement
from splitserve.logs import JsonFormatter, TextFormatter
from splitserve.router import direct
from splitserve.router.metrics import OUTCOMES
from splitserve.router.request_log import outcome_of
from splitserve.router.tenancy import generate_api_key, hash_api_key

from router_fakes import (
    DECODE_OK,
    ENGINE_TTFT_S,
    PREFILL_OK,
    Pool,
    build_router,
    completion_body,
    drain,
    http_request,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SLOTS = {"prefill": 64, "decode": 128}  # each pool's default max_num_seqs: its gate's capacity
KEY, OFF_KEY = generate_api_key(), generate_api_key()


def _config(**observability):
    """Disaggregated, tracing off, one tenant `acme` allowed two requests a minute."""
    return parse_config({
        "mode": "disaggregated",
        "disaggregation": {"prefill": "remote"},
        "tenants": [{"name": "acme", "api_key_hashes": [hash_api_key(KEY)],
                     "quotas": {"requests_per_minute": 2}},
                    {"name": "off", "enabled": False, "api_key_hashes": [hash_api_key(OFF_KEY)]}],
        "observability": observability,
    })


def _auth(key: str = KEY, **headers: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", **headers}


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a /metrics text, by (name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def _scrape(router) -> str:
    response = await type(router).metrics(router)  # the endpoint (the instance's `metrics`
    assert response.media_type.startswith("text/plain")  # attribute is the RouterMetrics)
    return response.body.decode()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def request_log():
    """The `splitserve.requests` records emitted during the test."""
    logger = logging.getLogger("splitserve.requests")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_requests_of_each_outcome_move_their_counters(request_log):
    async def run():
        decode = Pool(DECODE_OK, DECODE_OK, DECODE_OK, RuntimeError("engine died"))
        router = build_router(_config(), Pool(PREFILL_OK), decode)
        before = _samples(await _scrape(router))
        statuses = []

        async def send(body, headers, *, read=True):
            response = await router._serve("completions", http_request(body, headers))
            statuses.append(response.status_code)
            if read and hasattr(response, "body_iterator"):
                await drain(response)
            return response

        await send(completion_body(stream=False), _auth())                 # ok
        cancelled = await send(completion_body(), _auth(), read=False)     # ok so far...
        await anext(cancelled.body_iterator)  # ...the first event went out; the client leaves
        await cancelled.body_iterator.aclose()
        await asyncio.sleep(0.01)  # the dispatcher's stream: closed by the loop's finalizer
        await send(completion_body(), _auth())                             # 429: rpm is 2
        await send(completion_body(), {})                                  # 401: no key
        await send({"model": "other", "prompt": "x"}, _auth(generate_api_key()))  # 401
        await send(completion_body(), _auth(OFF_KEY))                      # 403: disabled
        return router, before, _samples(await _scrape(router)), statuses

    _, before, after, statuses = asyncio.run(run())
    assert statuses == [200, 200, 429, 401, 401, 403]

    def moved(**labels):
        return (_value(after, "splitserve_requests_total", **labels)
                - _value(before, "splitserve_requests_total", **labels))

    assert moved(outcome="ok", tenant="acme", status="200") == 1
    assert moved(outcome="cancelled", tenant="acme", status="200") == 1
    assert moved(outcome="rate_limited", tenant="acme", status="429") == 1
    assert moved(outcome="client_error", tenant="-", status="401") == 2
    assert moved(outcome="client_error", tenant="off", status="403") == 1
    assert moved() == 6
    assert {dict(ls)["outcome"] for (n, ls) in after if n == "splitserve_requests_total"} <= set(
        OUTCOMES)
    # Latency of the completed request only (the cancelled one is not a sample).
    assert _value(after, "splitserve_time_to_first_token_seconds_count", tenant="acme") == 1
    assert _value(after, "splitserve_e2e_request_latency_seconds_count", tenant="acme") == 1
    assert _value(after, "splitserve_time_per_output_token_seconds_count", tenant="acme") == 1
    assert _value(after, "splitserve_prompt_tokens_total") == 300
    assert _value(after, "splitserve_prompt_tokens_cached_total") == 288
    assert _value(after, "splitserve_generation_tokens_total") == 2
    # Per pool: both gates admitted the two served requests; the pools' share of TTFT.
    for pool in ("prefill", "decode"):
        assert _value(after, "splitserve_request_queue_time_seconds_count",
                      pool=pool, tenant="acme") == 2
        assert _value(after, "splitserve_pool_time_to_first_token_seconds_count", pool=pool) == 2
        assert _value(after, "splitserve_pool_replicas", pool=pool) == 1
        assert _value(after, "splitserve_pool_requests_running", pool=pool) == 0
        assert _value(after, "splitserve_pool_max_in_flight", pool=pool) == SLOTS[pool]
    assert _value(after, "splitserve_pool_time_per_output_token_seconds_count", pool="decode") == 1
    # The engines' own part of TTFT, as the workers reported it: both prefills, and the decode
    # hops that got a first token (the cancelled one did too).
    for pool, hop in (("prefill", "prefill"), ("decode", "generate")):
        assert _value(after, "splitserve_engine_time_to_first_token_seconds_count",
                      pool=pool, hop=hop) == 2
        assert _value(after, "splitserve_engine_time_to_first_token_seconds_sum",
                      pool=pool, hop=hop) == pytest.approx(2 * ENGINE_TTFT_S)
    assert _value(after, "splitserve_kv_transfer_bytes_count") == 1  # the cancelled: none
    assert _value(after, "splitserve_disagg_decisions_total", path="remote") == 2
    assert _value(after, "splitserve_requests_in_flight") == 0

    lines = [r.fields for r in request_log]
    assert [f["outcome"] for f in lines] == [
        "ok", "cancelled", "rate_limited", "client_error", "client_error", "client_error"]


def test_server_errors_and_worker_failures_are_outcomes_too():
    async def run():
        cfg = parse_config({"mode": "disaggregated", "router": {"decode_migrations": 0},
                            "disaggregation": {"prefill": "remote"},
                            "observability": {"request_log": False}})
        decode = Pool(RuntimeError("engine died"), WorkerError("decode-1", "gone"))
        router = build_router(cfg, Pool(PREFILL_OK), decode)
        statuses = []
        for stream in (False, True):
            response = await router._serve("completions", http_request(completion_body(
                stream=stream)))
            statuses.append(response.status_code)
        return statuses, _samples(await _scrape(router))

    statuses, samples = asyncio.run(run())
    assert statuses == [500, 500]  # a stream that fails before its first token keeps its status
    assert _value(samples, "splitserve_requests_total", outcome="error", tenant="default") == 2


def test_the_request_log_line_has_the_trace_id_and_no_prompt_unless_enabled(request_log):
    decode = Pool(DECODE_OK)

    async def run(**observability):
        router = build_router(_config(**observability), Pool(PREFILL_OK), decode)
        headers = _auth(traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-01")
        await drain(await router._serve("completions", http_request(completion_body(), headers)))

    asyncio.run(run())
    (record,) = request_log
    fields = record.fields
    assert fields["trace_id"] == TRACE_ID  # tracing is off: the caller's trace id
    # the id the engine's vLLM server got (its response ids are built from it)
    assert fields["request_id"] == decode.requests[0].http.json["request_id"]
    assert (fields["tenant"], fields["outcome"], fields["status"]) == ("acme", "ok", 200)
    assert (fields["prompt_tokens"], fields["cached_tokens"], fields["output_tokens"]) == (
        300, 288, 2)
    assert fields["stream"] is True and fields["finish_reason"] == "length"
    assert 0 <= fields["ttft_s"] <= fields["e2e_s"]
    assert "prompt" not in fields

    line = json.loads(JsonFormatter().format(record))
    assert line["logger"] == "splitserve.requests" and line["level"] == "info"
    assert line["trace_id"] == TRACE_ID and line["outcome"] == "ok"
    text = TextFormatter().format(record)
    assert f"trace_id={TRACE_ID}" in text and "tenant=acme" in text and "prompt=" not in text

    request_log.clear()
    asyncio.run(run(log_prompts=True))
    assert request_log[0].fields["prompt"] == list(range(300))

    request_log.clear()
    asyncio.run(run(request_log=False))
    assert request_log == []


def test_a_recomputed_handoff_is_counted_and_named_in_the_request_log(request_log):
    recomputed = [*DECODE_OK[:-1], dataclasses.replace(
        DECODE_OK[-1], kv_bytes=0, kv_transfer_s=None, kv_recomputed=KV_TRANSFER_ERROR)]

    async def run():
        router = build_router(_config(), Pool(PREFILL_OK), Pool(recomputed))
        await drain(await router._serve("completions", http_request(completion_body(), _auth())))
        await drain(await router._serve("completions", http_request(completion_body(), _auth())))
        return _samples(await _scrape(router))

    samples = asyncio.run(run())
    assert _value(samples, "splitserve_kv_recomputes_total", reason=KV_TRANSFER_ERROR) == 2
    assert _value(samples, "splitserve_kv_recomputes_total", reason=KV_EXPIRED) == 0
    assert _value(samples, "splitserve_kv_transfer_duration_seconds_count") == 0
    assert _value(samples, "splitserve_requests_total", outcome="ok") == 2  # served all the same
    assert [r.fields["kv_recomputed"] for r in request_log] == [KV_TRANSFER_ERROR] * 2
    assert "kv_recomputed=transfer_error" in TextFormatter().format(request_log[0])

    request_log.clear()

    async def pulled():
        router = build_router(_config(), Pool(PREFILL_OK), Pool(DECODE_OK))
        await drain(await router._serve("completions", http_request(completion_body(), _auth())))

    asyncio.run(pulled())
    assert request_log[0].fields["kv_recomputed"] is None


def test_directly_served_requests_are_counted_and_logged_when_their_replica_settles(
        request_log):
    """Direct streaming: no chunk crosses the router, so the request's metrics and log line
    come from the route (a refusal) or the replica's settlement (or its absence)."""
    cfg = _config()
    cfg = cfg.model_copy(update={"router": cfg.router.model_copy(
        update={"direct_ingress": True, "direct_streaming": True})})
    body = json.dumps(completion_body()).encode()

    async def route(router, headers):
        verdict, handoff = await router._route_verdict(headers, body, "http://127.0.0.1:1")
        if handoff is not None:
            router.dispatcher.release(handoff.reservation)
        return verdict

    async def run():
        router = build_router(cfg, Pool(PREFILL_OK), Pool([]))
        router.leases = direct.Leases()
        before = _samples(await _scrape(router))
        served = await route(router, _auth(traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-01"))
        assert served.kind == "serve" and request_log == []  # not over until settled
        lease = router.leases.take(served.ticket)
        lease.replica = "decode#1"
        await asyncio.sleep(0.02)  # the response, served by the replica
        await direct.settle(lease, Settlement(
            served.ticket, prompt_tokens=300, output_tokens=2, first_token_s=0.005, decode_s=0.01,
            finish_reason="length", cached_tokens=288))
        assert (await route(router, {})).status == 401  # refused at the route
        lost = await route(router, _auth())
        await direct.settle(router.leases.take(lost.ticket), None)  # its replica never settled
        assert (await route(router, _auth())).status == 429  # rpm is 2
        # a request the replica handed back to the router is recorded by the router's relay
        other = build_router(cfg, Pool(PREFILL_OK), Pool([]))
        other.leases = direct.Leases()
        handed_back = await route(other, _auth())
        await direct.settle(other.leases.take(handed_back.ticket),
                            Settlement(handed_back.ticket, generated=False))
        return served, before, _samples(await _scrape(router))

    served, before, after = asyncio.run(run())
    ok, refused, lost, limited = (r.fields for r in request_log)
    assert (ok["trace_id"], ok["request_id"], ok["tenant"], ok["replica"]) == (
        TRACE_ID, served.request_id, "acme", "decode#1")
    assert (ok["status"], ok["outcome"], ok["finish_reason"], ok["stream"]) == (
        200, "ok", "length", True)
    assert (ok["prompt_tokens"], ok["cached_tokens"], ok["output_tokens"]) == (300, 288, 2)
    assert 0.01 <= ok["ttft_s"] <= ok["e2e_s"] - 0.01  # the router's: the route, less the decode
    assert (refused["status"], refused["outcome"], refused["tenant"]) == (
        401, "client_error", "-")
    assert (lost["status"], lost["outcome"], lost["error"]) == (502, "error", "settlement_lost")
    assert (limited["status"], limited["outcome"]) == (429, "rate_limited")

    def moved(**labels):
        return (_value(after, "splitserve_requests_total", **labels)
                - _value(before, "splitserve_requests_total", **labels))

    assert [moved(outcome=o) for o in ("ok", "client_error", "error", "rate_limited")] == [
        1, 1, 1, 1]
    for name, value in (("splitserve_generation_tokens_total", 2),
                        ("splitserve_prompt_tokens_cached_total", 288),
                        ("splitserve_time_to_first_token_seconds_count", 1),
                        ("splitserve_time_per_output_token_seconds_count", 1)):
        assert _value(after, name) - _value(before, name) == value, name


@pytest.mark.parametrize(
    ("status", "kwargs", "outcome"),
    [(200, {}, "ok"), (200, {"cancelled": True}, "cancelled"), (429, {}, "rate_limited"),
     (404, {}, "client_error"), (413, {}, "client_error"), (503, {}, "unavailable"),
     (504, {}, "timeout"), (500, {}, "error"), (200, {"stream_status": 504}, "timeout"),
     (429, {"cancelled": True}, "cancelled")],
)
def test_outcome_of(status, kwargs, outcome):
    assert outcome_of(status, **kwargs) == outcome
    assert outcome in OUTCOMES


def test_top_parses_merges_and_draws_the_router_metrics():
    async def run():
        router = build_router(_config(), Pool(PREFILL_OK), Pool(DECODE_OK))
        first = top.parse(await _scrape(router), t=0.0)
        await drain(await router._serve("completions", http_request(completion_body(), _auth())))
        return first, top.parse(await _scrape(router), t=2.0)

    first, second = asyncio.run(run())
    both = top.merge([second, second])
    assert both.value("splitserve_requests_total") == 2 * second.value("splitserve_requests_total")
    assert both.value("splitserve_pool_replicas", pool="decode") == 1  # shared: not summed
    console = Console(record=True, width=160)
    console.print(top.render(second, first))
    screen = console.export_text()
    assert "prefill" in screen and "decode" in screen
    assert "requests ok" in screen and "0.50" in screen  # one request in two seconds


def test_histogram_quantile_interpolates_like_prometheus():
    buckets = [(0.1, 0.0), (0.2, 50.0), (0.4, 100.0), (float("inf"), 100.0)]
    assert top.histogram_quantile(0.5, buckets) == pytest.approx(0.2)
    assert top.histogram_quantile(0.75, buckets) == pytest.approx(0.3)
    assert top.histogram_quantile(0.9, [(1.0, 0.0), (float("inf"), 0.0)]) is None


def test_controller_metrics_count_decisions_and_scalings():
    m = ControllerMetrics()
    m.observe_decision("decode", ready=1, starting=0, target=1, desired=3, load=2.4, scaled=True)
    m.observe_decision("decode", ready=1, starting=2, target=3, desired=3, load=2.5, scaled=False)
    m.observe_decision("prefill", ready=2, starting=0, target=2, desired=1, load=0.3, scaled=True)
    s = _samples(m.render().decode())
    assert _value(s, "splitserve_controller_decisions_total", pool="decode", action="up") == 1
    assert _value(s, "splitserve_controller_decisions_total", pool="decode", action="hold") == 1
    assert _value(s, "splitserve_controller_scalings_total", pool="prefill", direction="down") == 1
    assert _value(s, "splitserve_controller_scalings_total", direction="up") == 1
    assert _value(s, "splitserve_controller_replicas", pool="decode", state="starting") == 2
    assert _value(s, "splitserve_controller_replicas", pool="decode", state="desired") == 3
    assert _value(s, "splitserve_controller_load_replicas", pool="prefill") == 0.3
    assert [action_of(2, d) for d in (1, 2, 3)] == ["down", "hold", "up"]


def test_engine_metrics_reach_the_engine_spec():
    from splitserve.engine.args import engine_spec

    on = parse_config({"observability": {"engine_metrics": True}})
    assert engine_spec(on, "decode", "cpu").engine_metrics is True
    assert engine_spec(parse_config({}), "prefill", "cpu").engine_metrics is False


def test_configure_logging_writes_json_lines_to_stderr(capsys):
    from splitserve.logs import configure_logging

    logger = logging.getLogger("splitserve")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        configure_logging("json")
        configure_logging("json")  # replaces its handler: one
        assert [h.get_name() for h in logger.handlers].count("splitserve-stderr") == 1
        logging.getLogger("splitserve.requests").info("request ok", extra={"fields": {"a": 1}})
        line = json.loads(capsys.readouterr().err.strip())
        assert (line["msg"], line["a"], line["logger"]) == ("request ok", 1, "splitserve.requests")
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


def test_top_is_a_cli_command():
    from splitserve.cli import build_parser

    args = build_parser().parse_args(["top", "--url", "http://r:8000", "--once"])
    assert args.func.__name__ == "_cmd_top" and args.url == ["http://r:8000"] and args.once
