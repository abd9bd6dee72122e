"""Fakes to drive the router's real request path without Ray: scripted pool handles, an HTTP
request, and a `Router` instance built by hand (its Serve constructor needs a cluster).

The gates, tenancy, dispatcher, metrics and the Router's own request methods are the real ones.
Used by test_tracing.py, test_observability.py and test_health.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from types import SimpleNamespace

from starlette.requests import Request

from splitserve.config import parse_config
from splitserve.engine.messages import GenerateChunk, GenerateRequest
from splitserve.router import tracing as tr
from splitserve.router.drain import Drain
from splitserve.router.dispatch import Dispatcher
from splitserve.router.metrics import RouterMetrics
from splitserve.router.prompts import PromptBuilder
from splitserve.router.signals import SignalRecorder
from splitserve.router.tenancy import Tenancy

HANDOFF = {
    "remote_engine_id": "prefill-x",
    "remote_block_ids": [[1, 2]],
    "remote_host": "127.0.0.1",
    "remote_port": 5000,
}
KV_BYTES = 123_456
KV_SECONDS = 0.004  # the decode worker's measured KV pull


class StreamResponse:
    """Like a Serve streaming response: iterable once, and cancellable."""

    def __init__(self, agen) -> None:
        self.agen = agen
        self.cancelled = False

    def __aiter__(self):
        return self.agen

    def cancel(self) -> None:
        self.cancelled = True


class HealthResponse:
    """Like a Serve response to `health.remote()`: awaitable, and cancellable."""

    def __init__(self, outcome) -> None:
        self.outcome = outcome
        self.cancelled = False

    def __await__(self):
        return self._answer().__await__()

    async def _answer(self) -> dict:
        await asyncio.sleep(0)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        if isinstance(self.outcome, asyncio.Event):
            await self.outcome.wait()
        return {"role": "fake"}

    def cancel(self) -> None:
        self.cancelled = True


class Pool:
    """A fake pool handle: each call plays the next scripted outcome, a list of chunks or an
    exception (the last outcome repeats). An `asyncio.Event` outcome waits for it to be set,
    then yields nothing more (a stream that hangs until the test lets it go)."""

    def __init__(self, *outcomes) -> None:
        self.outcomes = list(outcomes)
        self.requests: list[GenerateRequest] = []
        # what `health.remote()` does (the router's /health ping): None answers, an exception
        # raises it, an `asyncio.Event` hangs until it is set
        self.health_outcome: BaseException | asyncio.Event | None = None
        self.health = SimpleNamespace(remote=lambda: HealthResponse(self.health_outcome))

    def options(self, **_):
        return SimpleNamespace(generate=SimpleNamespace(remote=self._remote))

    def _remote(self, req):
        self.requests.append(req)
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        return StreamResponse(self.run(outcome, req))

    async def run(self, outcome, req=None):
        """The chunks of one scripted outcome (for a forwarded call, with its response bytes as
        vLLM's server would write them: the status first, then SSE events or one JSON body)."""
        await asyncio.sleep(0)
        if isinstance(outcome, BaseException):
            raise outcome
        if isinstance(outcome, asyncio.Event):
            await outcome.wait()
            return
        if req is not None and req.http is not None:
            outcome = http_chunks(req, outcome)
        for chunk in outcome:
            yield chunk
            await asyncio.sleep(0)


def http_chunks(req: GenerateRequest, chunks: list[GenerateChunk]) -> list[GenerateChunk]:
    """`chunks` as a forwarded call's answer, in the engine host's order: a status chunk, the
    text as SSE events and `[DONE]` (a stream) or one JSON body (not a stream), and last the
    request's figures (the finish reason, the KV pull) on a chunk of their own."""
    stream = bool(req.http.json.get("stream"))
    kind = "text/event-stream" if stream else "application/json"
    out = [GenerateChunk((), "", status=200, headers=(("content-type", kind),),
                         replica=chunks[0].replica if chunks else "")]
    text = ""
    for chunk in chunks:
        text += chunk.text
        if chunk.finish_reason is None:
            data = b"data: " + json.dumps({"choices": [{"text": chunk.text}]}).encode() + b"\n\n"
            out.append(dataclasses.replace(chunk, data=data if stream else b""))
            continue
        tokens = dataclasses.replace(chunk, finish_reason=None, kv_bytes=0, kv_transfer_s=None,
                                     kv_recomputed=None, kv_transfer_params=None)
        if stream:
            events = b"data: " + json.dumps({"choices": [{"text": chunk.text}]}).encode()
            out.append(dataclasses.replace(tokens, data=events + b"\n\n"))
            out.append(GenerateChunk((), "", data=b"data: [DONE]\n\n", replica=chunk.replica))
        else:
            body = {"model": req.http.json["model"], "choices": [{"text": text}]}
            out.append(dataclasses.replace(tokens, data=json.dumps(body).encode()))
        out.append(dataclasses.replace(chunk, token_ids=(), text=""))
    return out


ENGINE_TTFT_S = 0.02  # what the scripted engines report as their own time to first token
PREFILL_OK = [GenerateChunk((7,), "", kv_transfer_params=HANDOFF, replica="prefill-0",
                            engine_ttft_s=ENGINE_TTFT_S)]
DECODE_OK = [
    GenerateChunk((1,), "a", num_cached_tokens=288, replica="decode-0",
                  engine_ttft_s=ENGINE_TTFT_S),
    GenerateChunk((2,), "b", "length", num_cached_tokens=288, replica="decode-0",
                  kv_bytes=KV_BYTES, kv_transfer_s=KV_SECONDS),
]


def config(tracing: dict | None = None, **disagg):
    """A disaggregated config whose prompts all take the remote path (tracing on unless
    given)."""
    return parse_config({
        "mode": "disaggregated",
        "disaggregation": {"prefill": "remote", **disagg},
        "tracing": {"enabled": True} if tracing is None else tracing,
    })


def dispatcher(
    cfg, prefill: Pool, decode: Pool, tracing: tr.Tracing, *,
    metrics: RouterMetrics | None = None, tenancy: Tenancy | None = None,
) -> Dispatcher:
    """The real dispatcher over fake pools."""
    pools = {"prefill": prefill, "decode": decode}
    metrics = metrics or RouterMetrics()
    return Dispatcher(
        pools, cfg.disaggregation, metrics, tenancy or Tenancy.from_config(cfg),
        SignalRecorder(pools, observer=metrics), replicas={"prefill": 1, "decode": 1},
        tracing=tracing,
    )


def build_router(cfg, prefill: Pool | None, decode: Pool | None, exporter=None, *,
                 pools: dict[str, dict[str, Pool]] | None = None):
    """The Router's request path without Ray Serve: its class, built by hand. `pools`:
    {model: {role: Pool}} for a several-model config (instead of `prefill` and `decode`)."""
    from splitserve.router.app import Router
    from splitserve.router.pool_metrics import PoolStateCollector

    class _Router(Router.func_or_class):
        def __del__(self) -> None:  # Serve's wrapper has an async one, for a live replica
            pass

    router = object.__new__(_Router)
    router.cfg = cfg
    router.metrics = RouterMetrics()
    router.tenancy = Tenancy.from_config(cfg, registry=router.metrics.registry)
    router.tracing = tr.Tracing.from_config(cfg.tracing, exporter=exporter)
    prompts = object.__new__(PromptBuilder)
    prompts.tokenizer, prompts.max_model_len = [None] * 1000, cfg.model.max_model_len
    # the real per-model setup (routes, dispatcher, catalog) over the fake pools
    router._setup_models(pools or {"prefill": prefill, "decode": decode},
                         make_prompts=lambda _: prompts)
    router.metrics.registry.register(
        PoolStateCollector(router.tenancy.gates, router.dispatcher.replicas)
    )
    router._background = []
    router.stopping = Drain()
    return router


def http_request(body: dict, headers: dict[str, str] | None = None) -> Request:
    """A POST /v1/completions request with a JSON `body` (no disconnect while the test runs)."""
    raw = json.dumps(body).encode()
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            await asyncio.Event().wait()
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {
        "type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    return Request(scope, receive)


def completion_body(n_prompt: int = 300, stream: bool = True, max_tokens: int = 2) -> dict:
    """A completion request body with an `n_prompt`-token prompt (token ids)."""
    return {"model": "splitserve-tiny", "prompt": list(range(n_prompt)),
            "max_tokens": max_tokens, "stream": stream}


async def drain(response) -> list[bytes]:
    """Every body chunk of a streamed response."""
    return [event async for event in response.body_iterator]


def policy_router(cfg: dict, pool: str = "decode"):
    """A `PolicyRequestRouter` for `pool` as Serve would make it from config `cfg`, built
    without Serve's constructor (it needs a cluster) and with no replicas yet."""
    from splitserve.app import pool_deployment_options
    from splitserve.router.replica_router import PolicyRequestRouter

    kwargs = pool_deployment_options(parse_config(cfg), pool, "cpu")["request_router_config"][
        "request_router_kwargs"]
    router = PolicyRequestRouter.__new__(PolicyRequestRouter)
    router._replicas = {}
    router._replica_queue_len_cache = {}
    router.initialize_state(**kwargs)
    return router
