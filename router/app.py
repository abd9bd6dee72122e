"""The router: a Ray Serve ingress (FastAPI) speaking the OpenAI API.

Endpoints: `/v1/models`, `/v1/completions`, `/v1/chat/completions` (streamed over SSE or not,
`usage` in both), `/health` = `/health/ready` (readiness: 200 while the router can serve, "ok" or
"degraded"; 503 when it cannot, `router/readiness.py`), `/health/live` (liveness), `/metrics`,
`/v1/usage` (per-tenant usage for an admin key, summed over router replicas),
`POST /v1/admin/lora_adapters` and `DELETE /v1/admin/lora_adapters/{name}` (LoRA adapters at
run time, admin key). A request's `model` names a served model, a LoRA adapter or an alias
(`router/catalog.py`); each served model has its own pools (`router/model_routes.py`).
Every failure is an OpenAI error body with its HTTP status; nothing reaches a worker before the
request is fully validated and fits the context window.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry.context import Context
from ray import serve
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from splitserve.config import SplitserveConfig
from splitserve.deployment_key import deployment_key
from splitserve.logs import configure_logging
from splitserve.engine import routed
from splitserve.engine.messages import GenerateChunk, GenerateRequest, HTTPCall, Sampling
from splitserve.engine.routed import Settlement, Verdict
from splitserve.router import direct, forward
from splitserve.router.adapters import AdapterRegistry
from splitserve.router.catalog import ModelCatalog
from splitserve.router.deadline import TIMEOUT_HEADER, request_timeout, within_deadline
from splitserve.router.dispatch import Dispatcher, Handoff
from splitserve.router.drain import Drain
from splitserve.router.errors import (
    APIError,
    bad_request,
    model_not_found,
    sse,
    too_large,
    unavailable,
)
from splitserve.router.metrics import RouterMetrics
from splitserve.router.pool_metrics import PoolStateCollector
from splitserve.router.lora_admin import LoadAdapter, load_adapter, unload_adapter
from splitserve.router.model_routes import (
    ModelRoute,
    build_routes,
    health_names,
    pool_handles,
)
from splitserve.router.prompts import PromptBuilder
from splitserve.router.readiness import decide, log, pool_name
from splitserve.router.request_log import RequestObserver, trace_id_of
from splitserve.router.signals import ControllerLink, SignalRecorder
from splitserve.router.tenancy import Tenancy, Tenant
from splitserve.router.tenancy.admin import AdminAuth
from splitserve.router.tenancy.quotas import output_allowance
from splitserve.router.tenancy.report import usage_report
from splitserve.router.tenancy.service import pool_max_in_flight
from splitserve.router.tracing import NOOP_REQUEST, NoopRequestTrace, RequestTrace, Tracing
from splitserve.router.usage_board import UsagePublisher, deployment_actor_config

app = FastAPI(title="splitserve", docs_url=None, redoc_url=None)


@app.exception_handler(APIError)
async def _api_error(_: Request, err: APIError) -> JSONResponse:
    return err.response()


@app.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
    code = "not_found" if err.status_code == 404 else None
    return APIError(err.status_code, str(err.detail), code=code).response()


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it exceeds `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise too_large(limit)
        parts.append(part)
    return b"".join(parts)


REPLICA_HEADER = "x-splitserve-replica"  # the replica that served the request


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A generation request ready for the engines (`Router._prepare`)."""

    fwd: forward.Forwarded
    route: ModelRoute
    request: GenerateRequest  # with `http`, the call vLLM's server gets
    model: str  # the served model or adapter the request's `model` resolved to
    capped: int | None  # the output limit the router set (None: the client's own)


def _content_type(headers: tuple[tuple[str, str], ...]) -> str | None:
    """The content type of a response from vLLM's server (None: not given). Defined above the
    deployment class: Serve pickles the class by value with the globals it has seen so far."""
    return next((v for k, v in headers if k.lower() == "content-type"), None)


async def _aclose(chunks: AsyncIterator[GenerateChunk]) -> None:
    """Close `chunks`. Starlette awaits only coroutine functions: an async generator's bound
    `aclose` is not one, so it would be called in a thread and the close never awaited."""
    await chunks.aclose()  # type: ignore[attr-defined]


@serve.deployment(
    name="router",
    ray_actor_options={"num_cpus": 0},
    deployment_actors=[deployment_actor_config()],
)
@serve.ingress(app)
class Router:
    """The HTTP ingress. Holds one deployment handle per pool; stateless across requests."""

    def __init__(self, cfg: SplitserveConfig, pools: dict[str, Any]) -> None:
        """`pools`: {model name: {role: handle}} (or one model's {role: handle})."""
        self.cfg = cfg
        configure_logging(cfg.observability.log_format, cfg.observability.log_level)
        self.metrics = RouterMetrics()
        primary = cfg.model_views()[0]
        self.tenancy = Tenancy.from_config(primary, registry=self.metrics.registry)
        self.admin = AdminAuth.from_config(cfg)
        port = cfg.observability.router_metrics_port
        self.usage_board = UsagePublisher(
            self.tenancy.snapshot, serve.get_replica_context().replica_id.unique_id,
            families=None if port is None else lambda: list(self.metrics.registry.collect()),
            metrics_at=None if port is None else (port, cfg.router.host),
        )
        self.tracing = Tracing.from_config(cfg.tracing)
        self.stopping = Drain()  # `drain` (the launcher's stop) refuses, waits, ends
        # Direct streaming (router/direct.py): the admissions of requests replicas answer
        self.leases = direct.Leases() if cfg.router.direct_streaming else None
        self._setup_models(pools)
        self.metrics.registry.register(
            PoolStateCollector(self.tenancy.gates, self.dispatcher.replicas)
        )
        self.controller_link = self._link_controller(cfg)
        self._background = [self.usage_board.loop]
        if self.controller_link is not None:
            self._background.append(self.controller_link.loop)
        self._start_background()

    def _setup_models(
        self, pools: dict[str, Any], make_prompts: Any = None
    ) -> None:
        """Routes, adapters and the model catalog; the primary model's dispatcher, signals and
        tokenizer are also `self.dispatcher`, `self.signals`, `self.prompts`."""
        handles = pool_handles(self.cfg, pools)
        primary = self.cfg.model_views()[0].model.name
        self.signals = SignalRecorder(handles[primary], observer=self.metrics)

        def dispatcher(view: SplitserveConfig, hs: dict[str, Any], tenancy: Tenancy) -> Dispatcher:
            return Dispatcher(
                hs, self.cfg.disaggregation, self.metrics, tenancy,
                self.signals if view.model.name == primary else SignalRecorder(hs),
                replicas={role: p.replicas for role, p in view.deployed_pools().items()},
                decode_migrations=self.cfg.router.decode_migrations,
                tracing=self.tracing,
                streaming=self.cfg.router.streaming,
                tpot_slo_s=self.cfg.slo.tpot_ms / 1000, ttft_slo_s=self.cfg.slo.ttft_ms / 1000,
            )

        self.routes: dict[str, ModelRoute] = build_routes(
            self.cfg, handles, self.tenancy, dispatcher, make_prompts
        )
        self.dispatcher = self.routes[primary].dispatcher
        self.prompts: PromptBuilder = self.routes[primary].prompts
        self.pools = health_names(self.routes)
        self.adapters = AdapterRegistry.from_config(self.cfg)
        self.catalog = ModelCatalog.from_config(self.cfg, self.adapters)
        self.created = int(time.time())  # the model cards' `created`

    def _start_background(self) -> None:
        """Start the periodic publishers; a constructor has no running loop yet, so every request
        tries again (a cheap no-op once they run)."""
        for loop in self._background:
            loop.start()

    def _link_controller(self, cfg: SplitserveConfig) -> ControllerLink | None:
        """With `autoscaling` on: start (or find) the controller actor and report to it twice
        per control period, so that every period has this replica's signals."""
        if cfg.autoscaling is None:
            return None
        from splitserve.app import APP_NAME
        from splitserve.controller.live import ensure_controller

        ensure_controller(cfg, APP_NAME)
        return ControllerLink(
            serve.get_replica_context().replica_id.unique_id, self.signals, self.tenancy.gates,
            cfg.autoscaling.control_period_s / 2, self._resize_gates,
        )

    def _resize_gates(self, replicas: dict[str, int]) -> None:
        """Admission capacity and the spill rule follow the pools' ready replica counts."""
        for pool, n in replicas.items():
            gate = self.tenancy.gates.get(pool)
            if gate is not None and n > 0:
                gate.resize(pool_max_in_flight(self.cfg, pool, n))
                self.dispatcher.replicas[pool] = n

    # ---- plumbing -------------------------------------------------------------------------

    @app.get("/health")
    async def health(self) -> JSONResponse:
        """Readiness (`router/readiness.py`): 200 while the router can serve, its body `ok`, or
        `degraded` when a pool is short and a fallback serves (no prefill pool: local prefill on
        decode); 503 `unavailable` when no model's decode pool answers. Pool states are short
        words; what failed goes to the log. 503 `draining` once the replica is stopping."""
        if self.stopping.draining:
            return JSONResponse({"status": "draining"}, 503)
        pings: dict[str, dict[str, str]] = {}
        pools = [(m, role, h) for m, r in self.routes.items() for role, h in r.pools.items()]
        states = await asyncio.gather(
            *(self._ping(pool_name(m, role, len(self.routes)), h) for m, role, h in pools)
        )
        for (m, role, _), state in zip(pools, states, strict=True):
            pings.setdefault(m, {})[role] = state
        verdict = decide(pings, {m: r.view.mode for m, r in self.routes.items()})
        return JSONResponse(verdict.body(), verdict.http_status)

    @app.get("/health/ready")
    async def health_ready(self) -> JSONResponse:
        """The same as `/health`: the readiness probe."""
        return await self.health()

    @app.get("/health/live")
    async def health_live(self) -> JSONResponse:
        """Liveness: 200 whenever this router replica answers; no pool is pinged (a short pool
        is for readiness to say, and restarting the router would not bring it back)."""
        return JSONResponse({"status": "ok"})

    async def _ping(self, name: str, handle: Any) -> str:
        """One pool's state for the health endpoints (`readiness.POOL_STATES`); a failure is
        logged, once per change of state, and never returned as text."""
        resp = handle.health.remote()
        err: Exception | None = None
        try:
            await asyncio.wait_for(resp, self.cfg.router.health_timeout_s)
            state = "ok"
        except TimeoutError:
            resp.cancel()
            state = "timeout"
        except Exception as e:  # noqa: BLE001 - any failed ping means the pool is short
            state, err = "unavailable", e
        seen = self.__dict__.setdefault("_pool_states", {})
        if seen.get(name, "ok") != state:
            if state == "ok":
                log.info("health: pool %s answers again", name)
            else:
                log.warning("health: pool %s is %s: %r", name, state,
                            err or f"no answer within {self.cfg.router.health_timeout_s}s")
        seen[name] = state
        return state

    async def drain(self, grace_s: float) -> dict[str, int]:
        """Stop this replica serving (called on every replica by the launcher's stop, through
        `DeploymentHandle.broadcast`): new generation requests get 503 `shutting_down` and
        readiness 503 `draining`; requests in flight get `grace_s` to finish, then end with an
        error (router/drain.py). Answers once none is left: the `DrainReport` as a dict."""
        return dataclasses.asdict(await self.stopping.drain(grace_s))

    @app.get("/metrics")
    async def metrics(self) -> Response:
        """Prometheus text exposition of this router replica; 404 when
        `observability.router_metrics_port` serves every replica's there instead (per-tenant
        figures stay off the API port)."""
        if self.cfg.observability.router_metrics_port is not None:
            raise APIError(404, "Metrics are not served on the API port: scrape the metrics "
                           "port of the Ray head (observability.router_metrics_port).",
                           code="not_found")
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/usage")
    async def usage(self, request: Request, tenant: str | None = None) -> JSONResponse:
        """Per-tenant usage for an admin key: requests, tokens, rejections by reason, quota state.

        Totals over every router replica (via the usage board; other replicas' figures are at
        most about a second old), or this replica's alone with `"scope": "replica"` when the
        board cannot be reached. `?tenant=NAME`: one tenant (404 if unknown). 401 without a valid
        admin key; 404 when no admin key is configured. See `tenancy/report.py` for the body.
        """
        self.admin.check(request.headers.get("authorization"))
        snapshots, scope = await self.usage_board.collect()
        return JSONResponse(usage_report(snapshots, self.tenancy.tenants, scope=scope, only=tenant))

    @app.get("/v1/models")
    async def models(self, request: Request) -> JSONResponse:
        """The models, adapters and aliases the caller may use, OpenAI list format."""
        tenant = self.tenancy.authenticate(request.headers.get("authorization"))
        cards = self.catalog.cards(allowed=tenant.allowed_models, created=self.created)
        return JSONResponse({"object": "list", "data": cards})

    @app.get("/v1/models/{model_id:path}")
    async def model(self, request: Request, model_id: str) -> JSONResponse:
        """One model card, or 404 (also for a model the caller may not use)."""
        tenant = self.tenancy.authenticate(request.headers.get("authorization"))
        for card in self.catalog.cards(allowed=tenant.allowed_models, created=self.created):
            if card["id"] == model_id:
                return JSONResponse(card)
        raise model_not_found(model_id)

    # ---- LoRA adapters at run time (admin) ------------------------------------------------

    @app.post("/v1/admin/lora_adapters")
    async def load_lora_adapter(self, request: Request) -> JSONResponse:
        """Load a LoRA adapter into every pool of its base model, then serve it as a model.

        Body: {"lora_name", "lora_path", "base_model"} (`base_model` may be left out with one
        served model). 200 with the adapter's model card; 400 when an engine cannot load it
        (nothing is registered then); 404 unknown base model; 409 name taken.
        """
        self.admin.check(request.headers.get("authorization"))
        body = LoadAdapter.parse(await read_body(request, self.cfg.router.max_body_bytes))
        adapter = await load_adapter(self.routes, self.adapters, body, self.cfg.router.replicas)
        return JSONResponse(self._card(adapter.name))

    @app.delete("/v1/admin/lora_adapters/{name:path}")
    async def unload_lora_adapter(self, request: Request, name: str) -> JSONResponse:
        """Stop serving adapter `name` (new requests: 404), wait for its requests in flight to
        finish (up to `router.request_timeout_s`), then drop it from the engines."""
        self.admin.check(request.headers.get("authorization"))
        drained = await unload_adapter(
            self.routes, self.adapters, name, self.cfg.router.request_timeout_s
        )
        return JSONResponse({"id": name, "object": "model", "deleted": True, "drained": drained})

    def primary_model(self) -> str:
        """The primary model's id (the trace's model before the body names one)."""
        return self.cfg.model_views()[0].model.name

    def _card(self, model_id: str) -> dict[str, Any]:
        cards = self.catalog.cards(allowed=None, created=self.created)
        return next(c for c in cards if c["id"] == model_id)

    # ---- vLLM's own endpoints -----------------------------------------------------------

    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> Response:
        """vLLM's `/tokenize`, answered by a replica of the model's engines."""
        return await self._forward_plain(request, "/tokenize")

    @app.post("/detokenize")
    async def detokenize(self, request: Request) -> Response:
        """vLLM's `/detokenize`, answered by a replica of the model's engines."""
        return await self._forward_plain(request, "/detokenize")

    @app.get("/version")
    async def version(self) -> Response:
        """vLLM's `/version` (the engines' vLLM release)."""
        route = self.routes[self.primary_model()]
        return await self._call_engine(route, HTTPCall("GET", "/version"))

    async def _forward_plain(self, request: Request, path: str) -> Response:
        """A tenant's request to one of vLLM's non-generating endpoints of its model."""
        tenant = self.tenancy.authenticate(request.headers.get("authorization"))
        fwd = forward.parse("completions", await read_body(request, self.cfg.router.max_body_bytes))
        target = self.catalog.resolve(
            fwd.model or self.primary_model(), allowed=tenant.allowed_models,
            key=uuid.uuid4().hex,
        )
        payload = dict(fwd.payload)
        payload["model"] = target.adapter.name if target.adapter is not None else target.base
        return await self._call_engine(self.routes[target.base], HTTPCall("POST", path, json=payload))

    async def _call_engine(self, route: ModelRoute, call: HTTPCall) -> Response:
        """`call` on a replica of `route`'s decode pool, its answer as vLLM's server gave it."""
        status, headers, body = 502, (), bytearray()
        gen = route.pools["decode"].options(stream=True).serve_http.remote(call)
        try:
            async for chunk in gen:
                if chunk.status is not None:
                    status, headers = chunk.status, chunk.headers
                body.extend(chunk.data)
        except Exception as err:  # noqa: BLE001 - no replica could answer
            raise unavailable(f"No engine replica could answer ({type(err).__name__}).") from None
        finally:
            gen.cancel()
        return Response(bytes(body), status_code=status, media_type=_content_type(headers))

    # ---- direct streaming: the ingress request router (router/direct.py) -----------------

    def _direct_only(self) -> direct.Leases:
        """The open leases; 404 unless this router routes for direct streaming."""
        if self.leases is None:
            raise APIError(404, "Not found.", code="not_found")
        return self.leases

    @app.post("/internal/route")
    async def internal_route(self, request: Request) -> JSONResponse:
        """HAProxy's question for each POST with direct streaming: the decode replica that
        answers it and the `Verdict` header it gets (engine/routed.py). 404 without direct
        streaming; any other non-200 is HAProxy's 503."""
        leases = self._direct_only()
        self._start_background()
        await direct.close_expired(leases)
        server = request.scope["server"]  # where HAProxy reached this replica
        body = await request.body()
        verdict, handoff = await self._route_verdict(
            request.headers, body, f"http://{server[0]}:{server[1]}")
        try:
            replica = await direct.pick_replica(
                self.routes[self.primary_model()].pools["decode"],
                handoff.request if handoff is not None else None)
        except BaseException:
            await self._unlease(verdict.ticket, 503)
            raise
        finally:
            if handoff is not None:  # routed: the replica's own figures count it from now on
                self.dispatcher.release(handoff.reservation)
        lease = leases.peek(verdict.ticket) if verdict.ticket else None
        if lease is not None:
            lease.replica = replica
        sealed = dataclasses.replace(
            verdict, replica=replica, expires=time.time() + routed.VERDICT_TTL_S,
            body_sha256=routed.body_digest(body)).seal(deployment_key())
        return JSONResponse({"replica_id": replica, "request_headers": {routed.HEADER: sealed}})

    async def _unlease(self, ticket: str, status: int) -> None:
        """Close the lease of `ticket` (if any) for a request that will not be generated."""
        lease = self.leases.take(ticket) if ticket and self.leases is not None else None
        if lease is not None:
            await direct.settle(lease, Settlement(ticket, generated=False, status=status))

    async def _route_verdict(
        self, headers: Any, body: bytes, base_url: str
    ) -> tuple[Verdict, Handoff | None]:
        """The router's verdict on a request HAProxy asks about, and the dispatch of an
        admitted one (`Dispatcher.handoff`: the request its replica's routing reads, its KV
        handoff when it was prefilled remotely). A refusal is a verdict too: HAProxy would turn
        any answer but 200 into its own 503."""
        obs: RequestObserver | None = None  # set with `trace`
        trace: RequestTrace | NoopRequestTrace = NOOP_REQUEST
        try:
            self.stopping.admit()
            limit = self.cfg.router.max_body_bytes
            if "x-body-truncated" in headers or len(body) > limit:
                raise too_large(limit)
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
            endpoint = routed.guess_endpoint(payload)
            if endpoint is None:  # not a generation: the replica hands it to the router
                return Verdict("forward"), None
            # ended when the replica settles the request (or here, for a refusal)
            trace, obs = self._recorders(endpoint, headers)
            tenant = self.tenancy.authenticate(headers.get("authorization"))
            trace.describe(tenant=tenant)
            obs.describe(tenant=tenant.name)
            prep = self._prepare(forward.Forwarded(endpoint, payload), tenant)
            trace.describe(request=prep.request, stream=prep.fwd.stream)
            obs.describe(request=prep.request, stream=prep.fwd.stream,
                         prompt=prep.fwd.prompt_text() if obs.log_prompt else None)
            ticket, handoff = await self._lease(tenant, prep, obs, trace)
        except APIError as err:
            if obs is not None:
                obs.describe(tenant=getattr(err, "tenant", None))
                for end in (trace, obs):
                    end.answered(err.status, err)
            return Verdict("refuse", status=err.status, error=err.body(),
                           headers=dict(err.headers) or None), None
        except BaseException as err:  # HAProxy answers 503
            if obs is not None:
                for end in (trace, obs):
                    end.answered(503, err)
            raise
        req = handoff.request
        return Verdict(
            "serve", endpoint=endpoint, request_id=req.request_id, model=prep.model,
            max_tokens=prep.capped, cache_salt=req.cache_salt, ticket=ticket,
            settle_url=f"{base_url}/internal/settle",
            # the relay path's coalescing, at this router's open leases (this one's included)
            stream_interval=prep.route.dispatcher.chunk_tokens(
                len(self.leases), prep.route.dispatcher.replicas.get("decode", 1)),
            kv_transfer_params=req.kv_transfer_params,
        ), handoff

    async def _lease(
        self, tenant: Tenant, prep: Prepared, obs: RequestObserver,
        trace: RequestTrace | NoopRequestTrace,
    ) -> tuple[str, Handoff]:
        """Admit `prep`'s request as `_generate` would (its adapter's use, the tenant's quota
        reservation, a slot of the decode pool's fair gate, the drain count), dispatch it as
        far as its decode replica (`Dispatcher.handoff`: disaggregated, the decode reservation
        and the remote prefill, its spans under `trace`) and hold the admission as a lease until
        the replica settles (then `trace` and `obs` end); returns the lease's ticket and the
        dispatch."""
        assert self.leases is not None
        req, signals = prep.request, prep.route.dispatcher.signals
        n_prompt = len(req.prompt_token_ids)
        adapter = req.lora.name if req.lora is not None else None
        stack = contextlib.AsyncExitStack()
        try:
            stack.enter_context(self.stopping.hold())
            if adapter is not None:
                self.adapters.acquire(adapter)
                stack.callback(self.adapters.release, adapter)
            usage = await stack.enter_async_context(self.tenancy.request(
                tenant, prompt_tokens=n_prompt,
                max_tokens=req.sampling.max_tokens * prep.fwd.choices))
            signals.arrival("decode", n_prompt, req.sampling.max_tokens or 0)
            ticket = await stack.enter_async_context(
                self.tenancy.admit("decode", tenant, n_prompt))
            handoff = await prep.route.dispatcher.handoff(req, tenant, trace.context)
        except BaseException:
            await stack.aclose()
            raise
        self.metrics.in_flight.inc()
        stack.callback(self.metrics.in_flight.dec)

        def settled(s: Settlement | None) -> None:
            trace.settled(s)
            obs.settled(s, lease.replica)
            if s is None or not s.generated:
                return
            if s.first_token_s is not None:
                signals.first_token("decode", s.first_token_s)
                if handoff.pulled is not None:  # the handoff's latency, for the rule
                    prep.route.dispatcher.handoff_landed(handoff.pulled, s.first_token_s)
            if s.decode_s is not None:
                signals.finished("decode", s.decode_s, s.output_tokens)

        deadline = self.cfg.router.request_timeout_s + direct.SETTLE_GRACE_S
        lease = direct.Lease(
            stack, usage, ticket, "decode", self.leases.clock() + deadline, settled)
        return self.leases.add(lease), handoff

    @app.post("/internal/settle")
    async def internal_settle(self, request: Request) -> Response:
        """A replica's `Settlement` of a request it answered: 204, or 404 for a ticket that
        is not open (settled already, or expired)."""
        leases = self._direct_only()
        body = await request.body()
        if not routed.settlement_signed(deployment_key(), body,
                                        request.headers.get(routed.SETTLEMENT_MAC)):
            raise APIError(403, "Not a settlement from a replica of this deployment.",
                           code="forbidden")
        try:
            settlement = Settlement.from_json(body)
        except (ValueError, TypeError):
            raise bad_request("not a settlement") from None
        lease = leases.take(settlement.ticket)
        if lease is None:
            return Response(status_code=404)
        await direct.settle(lease, settlement)
        return Response(status_code=204)

    async def http(self, call: HTTPCall) -> AsyncIterator[GenerateChunk]:
        """A client request an engine replica hands over whole (direct streaming: all but the
        generation requests the router admitted), answered by this router's own HTTP app
        in-process: yields the response's start, then its body parts."""
        from splitserve.engine.vllm_server import call_chunks

        async for chunk in call_chunks(app, call):
            yield chunk

    # ---- generation -----------------------------------------------------------------------

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        """OpenAI completions."""
        return await self._serve("completions", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        """OpenAI chat completions."""
        return await self._serve("chat", request)

    def _recorders(
        self, endpoint: str, headers: Mapping[str, str]
    ) -> tuple[RequestTrace | NoopRequestTrace, RequestObserver]:
        """A request's root span (tracing on; router/tracing.py) and its metrics and log line
        (router/request_log.py), both recorded once the request is over."""
        trace = self.tracing.request(endpoint, headers, model=self.primary_model())
        return trace, RequestObserver(
            self.metrics, endpoint, trace_id=trace_id_of(trace.context, headers),
            log_request=self.cfg.observability.request_log,
            log_prompt=self.cfg.observability.log_prompts,
        )

    async def _serve(self, endpoint: str, request: Request) -> Response:
        self._start_background()
        self.metrics.in_flight.inc()
        status = 500
        error: BaseException | None = None
        # ended when the handler has answered and, for a stream, the chunk stream is closed
        trace, obs = self._recorders(endpoint, request.headers)
        try:
            self.stopping.admit()
            with self.stopping.hold():
                response = await self._handle(endpoint, request, trace, obs)
            status = response.status_code
            return response
        except APIError as err:
            status, error = err.status, err
            obs.describe(tenant=getattr(err, "tenant", None))  # a refused tenant's config name
            return err.response()
        except BaseException as err:
            error = err
            raise
        finally:
            self.metrics.in_flight.dec()
            trace.answered(status, error)
            obs.answered(status, error)

    async def _handle(
        self, endpoint: str, request: Request, trace: RequestTrace | NoopRequestTrace,
        obs: RequestObserver,
    ) -> Response:
        tenant = self.tenancy.authenticate(request.headers.get("authorization"))
        trace.describe(tenant=tenant)
        obs.describe(tenant=tenant.name)
        prep = self._prepare(forward.parse(
            endpoint, await read_body(request, self.cfg.router.max_body_bytes)), tenant)
        fwd, route, gen_req = prep.fwd, prep.route, prep.request
        trace.describe(request=gen_req, stream=fwd.stream)
        obs.describe(request=gen_req, stream=fwd.stream,
                     prompt=fwd.prompt_text() if obs.log_prompt else None)
        timeout_s = request_timeout(
            self.cfg.router.request_timeout_s, request.headers.get(TIMEOUT_HEADER)
        )
        chunks = obs.stream(trace.stream(self.stopping.guard(
            within_deadline(
                self._generate(tenant, gen_req, route, trace.context, n=fwd.choices), timeout_s
            )
        )))
        if fwd.stream:
            return await self._stream(chunks)
        return await self._whole(chunks)

    def _prepare(self, fwd: forward.Forwarded, tenant: Tenant) -> Prepared:
        """A generation request's body as the engines get it: its model resolved to a served
        model or adapter, its prompt counted, its output budget set (what the client asked
        for; else what the context leaves, or less where the tenant's token limits end it
        first, and then the engine stops there too) and its router fields written."""
        target = self.catalog.resolve(
            fwd.model or self.primary_model(), allowed=tenant.allowed_models,
            key=fwd.user or uuid.uuid4().hex,
        )
        route = self.routes[target.base]
        prompt = forward.estimate_prompt(fwd, route.prompts)
        request_id = uuid.uuid4().hex
        budget, capped = fwd.max_tokens, None
        if budget is None:
            room = max(route.prompts.max_model_len - len(prompt), 1)
            budget = output_allowance(tenant.quotas, len(prompt), room, fwd.choices)
            if budget < room:
                fwd, capped = forward.capped(fwd, budget), budget
        model = target.adapter.name if target.adapter is not None else target.base
        gen_req = GenerateRequest(
            request_id=request_id,
            prompt_token_ids=prompt,
            sampling=Sampling(max_tokens=budget),
            cache_salt=self.tenancy.cache_salt(tenant, fwd.cache_salt),
            lora=target.adapter,
            disaggregable=fwd.disaggregable,
        )
        gen_req = dataclasses.replace(gen_req, http=forward.call(
            fwd, model=model, request_id=request_id, cache_salt=gen_req.cache_salt,
        ))
        return Prepared(fwd, route, gen_req, model, capped)

    async def _generate(
        self, tenant: Tenant, gen_req: GenerateRequest, route: ModelRoute | None = None,
        trace_context: Context | None = None, *, n: int = 1,
    ) -> AsyncIterator[GenerateChunk]:
        """The request's chunks (of all `n` choices) on `route`'s pools (default: the primary
        model's) inside its tenant's quota reservation (settled on close). Its LoRA adapter, if
        any, counts the request as in flight until it ends (an unload waits for it)."""
        dispatcher = route.dispatcher if route is not None else self.dispatcher
        prompt, limit = len(gen_req.prompt_token_ids), gen_req.sampling.max_tokens * n
        adapter = gen_req.lora.name if gen_req.lora is not None else None
        if adapter is not None:
            self.adapters.acquire(adapter)
        try:
            async with self.tenancy.request(
                tenant, prompt_tokens=prompt, max_tokens=limit
            ) as usage:
                # one engine request: vLLM's server samples the n choices itself
                async for chunk in dispatcher.stream(gen_req, tenant, trace_context):
                    usage.add_output(len(chunk.token_ids))
                    yield chunk
        finally:
            if adapter is not None:
                self.adapters.release(adapter)

    async def _whole(self, chunks: AsyncIterator[GenerateChunk]) -> Response:
        """The engine's whole response, as vLLM's server wrote it."""
        status, headers, body, replica = 200, (), bytearray(), ""
        try:
            async for chunk in chunks:
                if chunk.status is not None:
                    status, headers = chunk.status, chunk.headers
                body.extend(chunk.data)
                replica = chunk.replica or replica
        finally:
            await chunks.aclose()
        return Response(bytes(body), status_code=status, media_type=_content_type(headers),
                        headers={REPLICA_HEADER: replica} if replica else None)

    async def _stream(self, chunks: AsyncIterator[GenerateChunk]) -> Response:
        # Wait for the response's start before answering 200, so that early failures (quota,
        # queue full, a request vLLM's server refuses, worker error) keep their HTTP status.
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            raise unavailable("The worker ended the request without output.") from None
        except BaseException:
            await chunks.aclose()
            raise

        async def events() -> AsyncIterator[bytes]:
            try:
                if first.data:
                    yield first.data
                async for chunk in chunks:
                    if chunk.data:
                        yield chunk.data
            except APIError as err:
                yield sse(err.body())
            finally:
                await chunks.aclose()

        # If the client is gone before the body starts, Starlette never runs `events`: close the
        # generator anyway so the quota is settled and the worker request cancelled.
        return StreamingResponse(
            events(),
            status_code=first.status or 200,
            media_type=_content_type(first.headers) or "text/event-stream",
            headers={REPLICA_HEADER: first.replica},
            background=BackgroundTask(_aclose, chunks),
        )
