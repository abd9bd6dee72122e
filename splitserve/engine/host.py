"""EngineHost: one vLLM `AsyncLLM` engine inside a Ray Serve replica.

The pool deployments (`splitserve.prefill_workers`, `splitserve.decode_workers`) subclass it.
Lifecycle: the constructor leases cores (CPU), sets the engine environment and builds the engine;
Serve routes nothing to the replica until the constructor returns. `check_health` is Serve's
health hook. `__del__` (called by Serve on graceful shutdown) stops the engine process and
returns the cores, so no `EngineCore` process outlives its replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray import serve

from splitserve.engine import faults, vllm_server
from splitserve.engine.args import STRUCTURED_OUTPUTS, EngineSpec, engine_env, engine_kwargs
from splitserve.engine.messages import (
    EngineStats,
    GenerateChunk,
    GenerateRequest,
    HTTPCall,
    LoraOp,
    LoraRef,
    RequestRejected,
    WorkerError,
    kv_recompute_reason,
)
from splitserve.engine.stats import LatestStats, RequestTransfer
from splitserve.engine.step_cost import DropIterationLines
from splitserve.engine.stream_server import StreamServer, over_http
from splitserve.kv_transfer.handoff import engine_kv_params
from splitserve.kv_transfer.nixl import free_port_block, nixl_env, nixl_transfer_config
from splitserve.kv_transfer.tier import engine_transfer_config, tier_transfer_config
from splitserve.models import resolve_model
from splitserve.router.forward import prefill_payload, samples
from splitserve.router.routing.kv_feed import EventSource

log = logging.getLogger("splitserve.engine")


def _replica_name() -> tuple[str, str | None]:
    """(a unique holder name, 'namespace/actor' of this replica or None outside Serve)."""
    try:
        ctx = serve.get_replica_context()
        holder = f"{ctx.deployment}#{ctx.replica_id.unique_id}"
    except Exception:  # not inside a Serve replica (direct use in tests)
        holder = f"pid-{os.getpid()}"
    rt = ray.get_runtime_context() if ray.is_initialized() else None
    actor = rt.get_actor_name() if rt is not None else None
    return holder, (f"{rt.namespace}/{actor}" if actor else None)


def kv_block_bytes(vllm_config) -> int:
    """Bytes of one KV block over all layers and KV heads (what NIXL moves per block)."""
    import torch

    model, cache = vllm_config.model_config, vllm_config.cache_config
    if cache.cache_dtype == "auto":
        elem = torch.empty((), dtype=model.dtype).element_size()
    else:  # fp8 variants are one byte; the 16-bit names two
        elem = 2 if cache.cache_dtype in ("bfloat16", "float16", "half") else 1
    layers = model.get_num_layers(vllm_config.parallel_config)
    per_token = 2 * layers * model.get_total_num_kv_heads() * model.get_head_size() * elem
    return per_token * cache.block_size


def kv_capacity_tokens(vllm_config) -> int:
    """The engine's KV cache in tokens: the blocks vLLM allocated (known once the engine has
    started; on the CPU VLLM_CPU_KVCACHE_SPACE / bytes per block) x tokens per block."""
    cache = vllm_config.cache_config
    return int(cache.num_gpu_blocks or 0) * int(cache.block_size or 0)


def _rejected(replica: str, status: int, body: bytes) -> WorkerError:
    """vLLM's server's error answer as an exception: a client error (4xx) is the client's, as
    vLLM wrote it; a server error is a worker failure (retried or migrated by the router)."""
    import json

    try:
        err = json.loads(body)["error"]
        message, param = str(err.get("message", "")), err.get("param")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, param = body.decode("utf-8", "replace"), None
    if status < 500:
        return RequestRejected(replica, message, param, status=status, body=body)
    return WorkerError(replica, f"vLLM server error {status}: {message}")


def _remote_blocks(params: dict[str, Any] | None) -> int:
    """Blocks a decode request pulls from its prefill worker (0 for a local prefill)."""
    if not params or not params.get("do_remote_prefill"):
        return 0
    if params.get("remote_engine_id") == faults.DEAD_PEER_ENGINE_ID:
        return 0  # an injected KV-load failure pulls nothing
    blocks = params.get("remote_block_ids") or []
    first = blocks[0] if blocks else []
    return len(first) if isinstance(first, (list, tuple)) else len(blocks)


class EngineHost:
    """Owns one engine. Subclasses add the role-specific request methods."""

    def __init__(self, spec: EngineSpec, *, prefill_pool: Any = None) -> None:
        """`prefill_pool`: the prefill pool's handle, bound to the decode pool only with direct
        streaming when disaggregated (`splitserve.app.build_app`): Serve must then find the
        prefill deployment in the application's main graph, since its ingress request router
        (the router, which runs the prefills) has to build into one deployment alone."""
        self.spec = spec
        self.prefill_pool = prefill_pool
        self._holder, actor = _replica_name()
        self._ledger = None
        cores: list[int] = []
        if spec.device == "cpu" and ray.is_initialized():
            from splitserve.controller.placement import core_ledger

            self._ledger = core_ledger()
            available = sorted(os.sched_getaffinity(0))
            lease = self._ledger.acquire.remote(
                self._holder, spec.ranks, available, actor, allow_shared=spec.share_cores
            )
            cores = ray.get(lease)
        elif spec.device == "cpu":
            cores = sorted(os.sched_getaffinity(0))[: spec.ranks]
        os.environ.update(engine_env(spec, cores))
        self.cores = cores
        self.replica_id = self._holder.split("#")[-1]
        self.engine_id = f"{spec.role}-{self.replica_id}"
        if spec.kv_transfer:
            host = spec.kv_host or ray.util.get_node_ip_address()
            port = free_port_block(host, spec.tensor_parallel_size)
            os.environ.update(nixl_env(host, port))
        if spec.kv_events:  # the KV-event publisher binds this address (args.KV_EVENTS_CONFIG)
            os.environ["VLLM_HOST_IP"] = spec.kv_host or ray.util.get_node_ip_address()
        model = resolve_model(spec.model, spec.tiny_variant)
        log.info("%s: starting engine on cores %s for %s%s", self._holder, cores, model.model,
                 f" at {model.revision}" if model.revision else "")
        self._stats = LatestStats()
        self._loras: dict[int, str] = {}  # adapters asked for, by id (vLLM's list is the truth)
        self._loaded_loras: list[int] = []  # vLLM's list as last read (routing stats)
        self.engine = self._build_engine(model.model, model.revision)
        self._app: Any = None  # vLLM's OpenAI server over the engine (built on first use)
        self._app_lock = asyncio.Lock()
        # Where responses stream to the router (started on first use, in the serving loop)
        self._stream_host = spec.kv_host or ray.util.get_node_ip_address()
        self._streams: StreamServer | None = None
        self.kv_block_bytes = kv_block_bytes(self.engine.vllm_config)
        self.kv_capacity_tokens = kv_capacity_tokens(self.engine.vllm_config)
        self.chunk_tokens = self.engine.vllm_config.scheduler_config.max_num_batched_tokens
        self.kv_events = self._kv_event_source()
        log.info("%s: KV cache of %d tokens%s", self._holder, self.kv_capacity_tokens,
                 f", KV events at {self.kv_events.endpoint}" if self.kv_events else "")

    def _kv_event_source(self) -> EventSource | None:
        """Where the engine publishes its KV events, as vLLM bound it (None: not publishing)."""
        if not self.spec.kv_events:
            return None
        bound = self.engine.engine_core.get_kv_event_sources().get(0)
        if bound is None:
            return None
        cache = self.engine.vllm_config.cache_config
        return EventSource(bound.endpoint, bound.replay_endpoint, int(cache.block_size),
                           str(cache.prefix_caching_hash_algo))

    def _build_engine(self, model_path: str, revision: str | None):
        from vllm.config import KVTransferConfig, StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = engine_kwargs(self.spec, model_path, revision)
        # the engine and vLLM's server share one structured-output config: the reasoning parser
        # tells both where a reasoning model's answer (and its output constraint) begins
        kwargs["structured_outputs_config"] = StructuredOutputsConfig(
            **STRUCTURED_OUTPUTS, reasoning_parser=self.spec.reasoning_parser or "")
        self._frontend_args = vllm_server.frontend_args(self.spec, kwargs)
        if "kv_events_config" in kwargs:
            from vllm.config import KVEventsConfig

            kwargs["kv_events_config"] = KVEventsConfig(**kwargs["kv_events_config"])
        nixl = nixl_transfer_config(
            self.engine_id, self.spec.device, self.spec.kv_lease_s, role=self.spec.role,
            backend=self.spec.nixl_backend) if self.spec.kv_transfer else None
        tier = tier_transfer_config(self.spec.kv_tier, self.spec.kv_tier_gib,
                                    self.spec.kv_tier_path, kv_events=self.spec.kv_events)
        transfer = engine_transfer_config(nixl, tier)
        if transfer is not None:
            kwargs["kv_transfer_config"] = KVTransferConfig(
                **{"engine_id": self.engine_id, **transfer})
        args = AsyncEngineArgs(**kwargs)
        loggers: list[Any] = [self._stats.factory]
        logging.getLogger("vllm.v1.metrics.loggers").addFilter(DropIterationLines())
        if self.spec.engine_metrics:  # vLLM's own metrics, on Ray's metrics endpoint
            from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

            loggers.append(RayPrometheusStatLogger)
        return AsyncLLM.from_engine_args(args, stat_loggers=loggers)

    async def _openai_app(self) -> Any:
        """vLLM's OpenAI server over this engine (built once, on first use)."""
        if self._app is None:
            async with self._app_lock:
                if self._app is None:
                    self._app = await vllm_server.build_app(self.engine, self._frontend_args)
        return self._app

    async def __serve_build_asgi_app__(self) -> Any:
        """Ray Serve's hook when this pool is the application's HTTP ingress (direct streaming,
        `engine/front.py`): the replica's front over vLLM's server, handing what the router
        answers to the router deployment of the same application."""
        from splitserve.app import ROUTER_DEPLOYMENT
        from splitserve.deployment_key import deployment_key
        from splitserve.engine.front import EngineFront, SettlementPoster

        ctx = serve.get_replica_context()
        router = serve.get_deployment_handle(ROUTER_DEPLOYMENT, ctx.app_name).options(stream=True)
        key = deployment_key()
        return EngineFront(await self._openai_app(), lambda call: router.http.remote(call),
                           SettlementPoster(key), key=key,
                           replica=ctx.replica_id.to_full_id_str(),
                           max_body_bytes=self.spec.max_body_bytes)

    async def _stream_server(self) -> StreamServer:
        """This replica's stream server (started once, on first use)."""
        if self._streams is None:
            async with self._app_lock:
                if self._streams is None:
                    server = StreamServer(self._stream_host)
                    await server.start()
                    log.info("%s: streaming responses from %s", self._holder, server.base_url)
                    self._streams = server
        return self._streams

    async def serve_http(self, call: HTTPCall) -> AsyncIterator[GenerateChunk]:
        """Forward `call` to vLLM's server (no engine hooks: `/tokenize`, `/detokenize`,
        `/version`, ...): yields the response start, then its body parts."""
        async for chunk in vllm_server.call_chunks(await self._openai_app(), call, self._holder):
            yield chunk

    async def _generate_http(self, req: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """`req.http` through vLLM's server, with the engine hooks of a request (the KV
        handoff's deadline, faults, the stream interval) and our figures read back."""
        assert req.http is not None
        app = await self._openai_app()
        if req.lora is not None:  # vLLM's server resolves the request's `model` to it
            app.state.openai_serving_models.lora_requests[req.lora.name] = self._lora_request(
                req.lora)
        expired = [False]

        def kv_params(params: dict[str, Any] | None) -> dict[str, Any] | None:
            params, expired[0] = engine_kv_params(params, time.time())
            if expired[0]:
                self._stats.kv_handoffs_expired += 1
                log.warning("%s: handoff of %s expired; recomputing", self._holder, req.request_id)
            if params is not None and self.spec.faults.active:
                params = self._faulty_kv_params(req, params)
            return params

        tap = vllm_server.RequestTap(stream_interval=req.stream_interval, kv_params=kv_params)
        status: int | None = None
        first_out, error, end = [True], bytearray(), bytearray()
        call = req.http
        pulled_by: vllm_server.RequestTap | None = None
        if req.kv_transfer_params is not None and samples(call.json) > 1:
            # Several samples of one prompt: its KV is pulled once, into the prefix cache, and
            # the samples then read it there (one transfer, not one per sample).
            pulled_by, call = await self._pull_once(app, call, kv_params)

        def progress(data: bytes = b"") -> GenerateChunk:
            """The tokens made since the last chunk (with vLLM's first-token latency on the
            first), and the response bytes written meanwhile."""
            engine_ttft = None
            if first_out[0] and tap.engine_ttft_s is not None:
                first_out[0], engine_ttft = False, tap.engine_ttft_s
            return GenerateChunk(
                tap.take_tokens(), "", data=data, replica=self._holder,
                num_prompt_tokens=tap.num_prompt_tokens,
                num_cached_tokens=tap.num_cached_tokens, engine_ttft_s=engine_ttft,
            )

        try:
            parts = vllm_server.tapped_call(
                app, call.method, call.path, call.headers, call.encoded(), call.query, tap
            )
            async with contextlib.aclosing(parts):
                async for part in parts:
                    if part is None:  # tokens before a response that is not streamed began
                        yield progress()
                        continue
                    if isinstance(part, vllm_server.HTTPResponseStart):
                        status = part.status
                        if status >= 400:
                            continue
                        yield GenerateChunk((), "", status=status, headers=part.headers,
                                            replica=self._holder)
                        continue
                    if status is not None and status >= 400:
                        error.extend(part)
                        continue
                    if tap.finished:  # the response's end: it goes with the request's figures
                        end.extend(part)
                        continue
                    yield progress(part)
            if status is not None and status >= 400:
                raise _rejected(self.replica_id, status, bytes(error))
            measured = None
            pulling = pulled_by or tap
            for rid in pulling.request_ids:
                measured = self._stats.pop_request_transfer(rid) or measured
            recomputed = self._recomputed(req, expired[0], measured)
            pulled = _remote_blocks(pulling.remote_kv) * self.kv_block_bytes
            yield dataclasses.replace(
                progress(bytes(end)), finish_reason=tap.finish_reason or "stop",
                kv_bytes=measured.bytes if measured else pulled,
                kv_transfer_s=measured.seconds if measured and measured.transfers else None,
                kv_recomputed=recomputed, kv_transfer_params=tap.kv_transfer_params,
                engine_cost=self._stats.step_cost(self.chunk_tokens),
            )
        finally:
            for rid in tap.request_ids + (pulled_by.request_ids if pulled_by else []):
                self._stats.pop_request_transfer(rid)

    async def _pull_once(
        self, app: Any, call: HTTPCall, kv_params: Any
    ) -> tuple[vllm_server.RequestTap, HTTPCall]:
        """Pull a handoff's KV with a one-token request of the same prompt (its blocks stay in
        this engine's prefix cache), and return its tap and `call` without the handoff: the
        samples that follow find the prompt cached. A failed pull costs nothing but the
        prefill the samples then do themselves."""
        body = prefill_payload(call.json or {})
        body["request_id"] = f"{body.get('request_id', 'req')}-pull"
        pull = dataclasses.replace(call, json=body)
        tap = vllm_server.RequestTap(kv_params=kv_params)
        parts = vllm_server.tapped_call(
            app, pull.method, pull.path, pull.headers, pull.encoded(), pull.query, tap)
        async with contextlib.aclosing(parts):
            async for part in parts:
                if isinstance(part, vllm_server.HTTPResponseStart) and part.status >= 400:
                    log.warning("%s: pulling the KV of %s failed (%d); its samples prefill it",
                                self._holder, body["request_id"], part.status)
        rest = {k: v for k, v in (call.json or {}).items() if k != "kv_transfer_params"}
        return tap, dataclasses.replace(call, json=rest)

    async def generate(self, req: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Run one forwarded request (`req.http`) through vLLM's server to its end: yields the
        response's start, its body parts with the output tokens made meanwhile, and last a
        chunk with the request's figures (`_generate_http`).

        Cancelling the consumer tells vLLM's server its client left: vLLM aborts the request
        and frees its blocks. A handoff past its fetch deadline is recomputed instead of pulled.
        vLLM's 4xx is raised as `RequestRejected` with its body; an engine failure as
        `WorkerError` naming this replica, so that the router can retry elsewhere.
        """
        if req.http is None:
            raise RequestRejected(self.replica_id, "not a forwarded call (GenerateRequest.http)")
        try:
            if self.spec.faults.active:
                await self._inject_faults(req)
            chunks = self._generate_http(req)
            if req.http_stream:
                chunks = over_http(await self._stream_server(), chunks, self._holder)
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    yield chunk
            if req.lora is not None:  # the engine may have loaded it just now
                self._loaded_loras = sorted(await self.engine.list_loras())
        except RequestRejected:
            raise
        except Exception as err:  # noqa: BLE001 - cancellation (BaseException) passes through
            raise WorkerError(self.replica_id, f"{type(err).__name__}: {err}") from None

    def _recomputed(
        self, req: GenerateRequest, expired: bool, measured: RequestTransfer | None
    ) -> str | None:
        """Why `req`'s handoff was recomputed instead of pulled (None: it was not), logged."""
        reason = kv_recompute_reason(
            expired=expired, load_failed=measured is not None and measured.failed
        )
        if reason is not None and not expired:  # an expired handoff was logged when it came in
            log.warning("%s: KV pull of %s failed; recomputed", self._holder, req.request_id)
        return reason

    async def _inject_faults(self, req: GenerateRequest) -> None:
        """Tests only (`faults` config): slow or fail this request before the engine sees it."""
        f, ids = self.spec.faults, req.prompt_token_ids
        if self.spec.role == "prefill":
            if f.prefill_delay_s:
                await asyncio.sleep(f.prefill_delay_s)
            if faults.prefill_fails(f, ids):
                raise faults.InjectedFault("injected prefill failure")
        elif req.kv_transfer_params and req.kv_transfer_params.get("do_remote_prefill"):
            delay = faults.kv_load_delay_s(f, ids)
            if delay:
                await asyncio.sleep(delay)

    def _faulty_kv_params(self, req: GenerateRequest, params: dict[str, Any]) -> dict[str, Any]:
        """Tests only: point a hit prompt's KV pull at a dead peer (the connector then fails)."""
        if self.spec.role != "decode" or not faults.kv_load_fails(
            self.spec.faults, req.prompt_token_ids
        ):
            return params
        if not hasattr(self, "_dead_port"):
            self._dead_port = faults.closed_port(str(params.get("remote_host") or "127.0.0.1"))
        return faults.dead_peer_params(params, self._dead_port)

    def _lora_request(self, ref: LoraRef | None):  # -> vllm LoRARequest | None
        """vLLM's request for `ref`; the engine loads the adapter from its path on first use."""
        if ref is None:
            return None
        if not self.spec.max_loras:
            raise RequestRejected(self.replica_id, "LoRA adapters are off on this model", "model")
        from vllm.lora.request import LoRARequest

        self._loras[ref.lora_id] = ref.name
        return LoRARequest(ref.name, ref.lora_id, ref.path)

    async def load_lora(self, op: LoraOp) -> dict[str, Any]:
        """Load `op.ref` into the engine now (idempotent); returns {"replica": this replica's
        id, "loras": the loaded adapter ids}.

        Raises `RequestRejected` when the adapter cannot be loaded (missing files, rank over
        `max_lora_rank`, LoRA off): the router registers an adapter only after every replica of
        every pool of its model loaded it.
        """
        ref = op.ref
        try:
            lora = self._lora_request(ref)
            await self.engine.add_lora(lora)
            # vLLM's server serves it by name (its own registry of adapters, with our id)
            (await self._openai_app()).state.openai_serving_models.lora_requests[ref.name] = lora
        except RequestRejected:
            raise
        except Exception as err:  # noqa: BLE001 - vLLM raises plain errors for bad adapters
            self._loras.pop(ref.lora_id, None)
            raise RequestRejected(self.replica_id, f"cannot load adapter {ref.name!r}: {err}",
                                  "lora_path") from None
        return {"replica": self.replica_id, "loras": await self.loras()}

    async def unload_lora(self, op: LoraOp) -> dict[str, Any]:
        """Drop adapter `op.ref` from the engine (no-op if absent); returns like `load_lora`.
        Requests already running with it still finish: the router unloads only once it has no
        request in flight, and the engine reloads an adapter a running request needs."""
        lora_id = op.ref.lora_id
        if self.spec.max_loras and lora_id in await self.engine.list_loras():
            await self.engine.remove_lora(lora_id)
        self._loras.pop(lora_id, None)
        (await self._openai_app()).state.openai_serving_models.lora_requests.pop(op.ref.name, None)
        return {"replica": self.replica_id, "loras": await self.loras()}

    async def loras(self) -> list[int]:
        """The adapter ids loaded in this engine now."""
        if not self.spec.max_loras:
            return []
        self._loaded_loras = sorted(await self.engine.list_loras())
        return self._loaded_loras

    def record_routing_stats(self) -> dict[str, Any]:
        """Serve's hook: load figures the pool's request router reads (see replica_router)."""
        s = self._stats.snapshot(
            role=self.spec.role,
            replica=self._holder,
            num_unfinished=self.engine.get_num_unfinished_requests(),
        )
        return {"num_unfinished": s.num_unfinished, "kv_cache_usage": s.kv_cache_usage,
                "kv_capacity_tokens": self.kv_capacity_tokens,
                "loras": list(self._loaded_loras),
                "kv_events": self.kv_events.to_stats() if self.kv_events else None}

    async def check_health(self) -> None:
        """Serve's health hook: raises when the engine process is dead."""
        await self.engine.check_health()

    async def health(self) -> dict:
        """For the router's /health: raises like check_health, else a short status. The first
        call also builds vLLM's server and starts the stream server, so that no request waits
        for them."""
        await self.engine.check_health()
        await self._openai_app()
        await self._stream_server()
        return {"role": self.spec.role, "replica": self._holder, "cores": self.cores}

    async def stats(self) -> EngineStats:
        """The latest scheduler snapshot plus the live unfinished-request count and the
        stream server's streams."""
        snap = self._stats.snapshot(
            role=self.spec.role,
            replica=self._holder,
            num_unfinished=self.engine.get_num_unfinished_requests(),
            kv_capacity_tokens=self.kv_capacity_tokens,
        )
        if self._streams is None:
            return snap
        return dataclasses.replace(snap, streams_opened=self._streams.opened,
                                   open_streams=self._streams.open_streams)

    async def reset_prefix_cache(self) -> bool:
        """Drop this engine's cached prefix blocks (benchmarks and parity tests use it)."""
        return await self.engine.reset_prefix_cache()

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
            self.engine = None
        ledger = getattr(self, "_ledger", None)
        if ledger is not None:
            try:
                ledger.release.remote(self._holder)
            except Exception:  # the cluster is going away too
                pass
            self._ledger = None
