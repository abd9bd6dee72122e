"""Pure mapping from the deployment config to one engine's arguments and environment.

Nothing here imports vLLM or Ray: `EngineSpec` is what a worker needs to build its engine, and
`engine_kwargs` / `engine_env` turn it into `AsyncEngineArgs` keywords and process environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

from splitserve.config import FaultsConfig, RouterConfig, SplitserveConfig
from splitserve.engine.vllm_plugin import FORK_WORKERS_ENV, MQ_WAIT_ENV

Role = Literal["prefill", "decode"]

# vLLM `StructuredOutputsConfig` of every engine. Compact JSON: with free whitespace the grammar
# lets a model put any run of spaces, tabs and newlines between JSON tokens, and a weak model
# (the tiny one always, a real one sometimes) fills `max_tokens` with it and returns truncated
# JSON. vLLM allows compact JSON only with a fixed backend: xgrammar, its default choice; a
# schema feature xgrammar cannot compile is then the client's 400 instead of a fallback.
STRUCTURED_OUTPUTS: dict[str, Any] = {"backend": "xgrammar", "disable_any_whitespace": True}

# oneDNN's process-wide primitive cache, off in every CPU engine. vLLM's CPU linear layers keep
# their own small LRU of matmul primitives per weight shape (32 token counts each); oneDNN's
# global cache (1024 entries by default) keeps every primitive alive long after vLLM's LRU let
# go of it, one per token count M seen, and each new prompt length is a new M. Measured with the
# tiny model (scripts/engine_mem_probe.py, 300 prompts of random length 16-1500, then the same
# lengths again): default cache, the worker grew 1683 -> 2159 MiB in the first pass (about
# 1.8 MiB per new length) and stayed flat in the second; cache off, 1683 -> 1808 MiB, flat after
# the first 100 prompts, and the passes took 11 % less time, not more. The first 30-minute
# soak's prefill worker grew 1754 -> 2404 MiB, slowing down as the cache filled (BENCHMARKS.md).
ONEDNN_PRIMITIVE_CACHE_CAPACITY = 0

# vLLM's KV-event publisher of every engine when `router.routing.kv_events` is on: "tcp://*:0"
# binds the replica's address (VLLM_HOST_IP, set by the host like the NIXL side channel's) on a
# port the OS picks, and vLLM reports the address it bound (`get_kv_event_sources`), which the
# replica advertises to the routers. The replay endpoint serves the last `buffer_steps` batches
# to a router that (re)subscribes (router/routing/kv_feed.py).
KV_EVENTS_CONFIG: dict[str, Any] = {
    "enable_kv_cache_events": True, "publisher": "zmq",
    "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0", "topic": "kv",
}

# vLLM's tool-call parser of the built-in tiny model (model.path null, model.tool_call_parser
# unset): "pythonic" needs no special token in the vocabulary, which the tiny model lacks.
TINY_TOOL_CALL_PARSER = "pythonic"


@dataclass(frozen=True)
class EngineSpec:
    """Everything one worker engine is built from (frozen, picklable, no vLLM types)."""

    role: Role
    model: str | None  # config's model.path; resolved to a directory by the worker
    served_name: str
    max_model_len: int
    dtype: str
    seed: int
    device: Literal["cpu", "cuda"]
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_num_seqs: int
    kv_cache_gib: int
    gpu_memory_utilization: float
    step_wait_ms: int = 0  # CPU: message-queue recheck interval in ms; 0: vLLM's spin
    block_size: int | None = None
    kv_cache_dtype: str = "auto"
    max_num_batched_tokens: int | None = None  # tokens per step; None: vLLM's default
    kv_transfer: bool = False  # NIXL connector on (disaggregated mode)
    # The address the engine's peers reach it at (NIXL side channel, response streams);
    # None: the node's IP
    kv_host: str | None = None
    share_cores: bool = False  # dev/test only: engines may share cores when short
    kv_lease_s: int = 30  # prefill keeps unpulled KV blocks this long (NIXL kv_lease_duration)
    nixl_backend: str = "UCX"  # NIXL transport (LIBFABRIC on EFA): config.kv_transfer.fabric
    engine_metrics: bool = False  # export vLLM's metrics through Ray's metrics agent
    tiny_variant: int = 0  # built-in tiny model's weight variant (model None only)
    max_loras: int = 0  # LoRA adapters resident at once; 0: LoRA off
    max_lora_rank: int = 16
    # vLLM's server options of the model (`--tool-call-parser`, `--reasoning-parser`,
    # `--chat-template`); None: vLLM's defaults
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None
    scheduling_policy: str = "fcfs"  # vLLM's scheduler policy ("priority": requests' priority)
    kv_events: bool = False  # publish vLLM's KV cache events (router.routing.kv_events)
    kv_cache_blocks: int | None = None  # vLLM's num_gpu_blocks_override; None: what fits
    # the KV tier beyond the engine's KV (config kv_tier, kv_transfer/tier.py)
    kv_tier: Literal["none", "cpu", "disk"] = "none"
    kv_tier_gib: float | None = None
    kv_tier_path: str | None = None
    # the router's body limit, which the replica's own HTTP front (direct streaming) applies
    max_body_bytes: int = RouterConfig.model_fields["max_body_bytes"].default
    # tests only: injected faults (all off by default)
    faults: FaultsConfig = field(default_factory=FaultsConfig)

    @property
    def ranks(self) -> int:
        """Engine ranks per replica (TP x PP): cores on the CPU, GPUs on CUDA."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


def engine_spec(
    cfg: SplitserveConfig,
    role: Role,
    device: Literal["cpu", "cuda"],
    *,
    kv_host: str | None = None,
) -> EngineSpec:
    """The engine spec of pool `role` under `cfg` (a single-model view, see
    `SplitserveConfig.model_views`) on `device`.

    `kv_host` is the NIXL side-channel address (127.0.0.1 for a single-machine cluster).
    """
    pool = cfg.pools.decode if role == "decode" else cfg.pools.prefill
    dtype = cfg.model.dtype
    if dtype == "auto" and cfg.model.path is None:
        # The tiny model is float32; keeping it avoids bf16 ties that make greedy parity flaky.
        dtype = "float32"
    return EngineSpec(
        role=role,
        model=cfg.model.path,
        served_name=cfg.model.name,
        max_model_len=cfg.model.max_model_len,
        dtype=dtype,
        seed=cfg.model.seed,
        device=device,
        tensor_parallel_size=pool.tensor_parallel_size,
        pipeline_parallel_size=pool.pipeline_parallel_size,
        max_num_seqs=pool.max_num_seqs,
        kv_cache_gib=pool.kv_cache_gib,
        gpu_memory_utilization=pool.gpu_memory_utilization,
        step_wait_ms=pool.step_wait_ms,
        block_size=pool.block_size,
        kv_cache_dtype=pool.kv_cache_dtype,
        max_num_batched_tokens=pool.max_num_batched_tokens,
        kv_transfer=cfg.mode == "disaggregated",
        kv_host=kv_host,
        share_cores=cfg.placement.share_cores,
        kv_lease_s=cfg.disaggregation.kv_lease_s,
        nixl_backend=cfg.kv_transfer.nixl_backend,
        engine_metrics=cfg.observability.engine_metrics,
        tiny_variant=cfg.model.tiny_variant,
        max_loras=cfg.lora.max_loras if cfg.lora is not None else 0,
        max_lora_rank=cfg.lora.max_lora_rank if cfg.lora is not None else 16,
        faults=cfg.faults,
        # the built-in tiny model's family parser: pythonic tool calls (no special tokens)
        tool_call_parser=cfg.model.tool_call_parser or (
            TINY_TOOL_CALL_PARSER if cfg.model.path is None else None),
        reasoning_parser=cfg.model.reasoning_parser,
        chat_template=cfg.model.chat_template,
        scheduling_policy=pool.scheduling_policy,
        kv_events=cfg.router.routing.kv_events,
        kv_cache_blocks=pool.kv_cache_blocks,
        kv_tier=cfg.kv_tier.medium,
        kv_tier_gib=cfg.kv_tier.size_gib,
        kv_tier_path=cfg.kv_tier.path,
        max_body_bytes=cfg.router.max_body_bytes,
    )


def engine_kwargs(spec: EngineSpec, model_path: str, revision: str | None = None) -> dict[str, Any]:
    """Keyword arguments for `vllm.AsyncEngineArgs`. `model_path` and `revision` are what
    `splitserve.models.resolve_model` made of the spec's model: a directory, or a hub repo id
    and its revision (vLLM's `revision`; its tokenizer follows it)."""
    kwargs: dict[str, Any] = {
        "model": model_path,
        "served_model_name": spec.served_name,
        "max_model_len": spec.max_model_len,
        "dtype": spec.dtype,
        "seed": spec.seed,
        "tensor_parallel_size": spec.tensor_parallel_size,
        "pipeline_parallel_size": spec.pipeline_parallel_size,
        "max_num_seqs": spec.max_num_seqs,
        "enable_prefix_caching": True,
        "disable_log_stats": False,
        # vLLM times each step and counts what it ran: the host fits the engine's step cost
        # from it for the router's disaggregation rule (engine/step_cost.py)
        "enable_logging_iteration_details": True,
        "kv_cache_dtype": spec.kv_cache_dtype,
        "scheduling_policy": spec.scheduling_policy,
    }
    if spec.kv_events:  # vllm.config.KVEventsConfig keywords (the host builds it)
        kwargs["kv_events_config"] = dict(KV_EVENTS_CONFIG)
    if revision is not None:
        kwargs["revision"] = revision
    if spec.block_size is not None:
        kwargs["block_size"] = spec.block_size
    if spec.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = spec.max_num_batched_tokens
    if spec.kv_cache_blocks is not None:
        kwargs["num_gpu_blocks_override"] = spec.kv_cache_blocks
    if spec.max_loras:
        # vLLM keeps up to max_cpu_loras adapters loaded (its own LRU) and runs max_loras of them
        # in one batch; equal, so the router's residency bound is the engine's.
        kwargs.update(enable_lora=True, max_loras=spec.max_loras,
                      max_cpu_loras=spec.max_loras, max_lora_rank=spec.max_lora_rank)
    if spec.device == "cpu":
        kwargs["enforce_eager"] = True  # no graph capture on the CPU; starts in seconds
    else:
        kwargs["gpu_memory_utilization"] = spec.gpu_memory_utilization
    return kwargs


def omp_threads_bind(cores: list[int], ranks: int) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for `ranks` ranks over `cores`: disjoint groups joined by '|'.

    >>> omp_threads_bind([2, 3], 2)
    '2|3'
    >>> omp_threads_bind([0, 1, 2, 3], 2)
    '0,1|2,3'
    """
    if ranks < 1 or len(cores) < ranks or len(cores) % ranks:
        raise ValueError(f"cannot split cores {cores} evenly over {ranks} ranks")
    per = len(cores) // ranks
    groups = [cores[i * per : (i + 1) * per] for i in range(ranks)]
    return "|".join(",".join(str(c) for c in g) for g in groups)


def engine_env(spec: EngineSpec, cores: list[int]) -> dict[str, str]:
    """Environment the engine process needs (CPU: core binding, KV space, no oneDNN cache, the
    EngineCore forking its worker: `SPLITSERVE_FORK_ENGINE_WORKERS=0` in the deployment's
    environment turns that off; the message-queue wait, empty for vLLM's busy-wait)."""
    if spec.device != "cpu":
        return {}
    return {
        "VLLM_CPU_OMP_THREADS_BIND": omp_threads_bind(cores, spec.ranks),
        "VLLM_CPU_KVCACHE_SPACE": str(spec.kv_cache_gib),
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(ONEDNN_PRIMITIVE_CACHE_CAPACITY),
        # The EngineCore forks its worker instead of spawning it (vllm_plugin.fork_engine_workers)
        # unless the deployment's environment says 0.
        FORK_WORKERS_ENV: "0" if os.environ.get(FORK_WORKERS_ENV) == "0" else "1",
        MQ_WAIT_ENV: str(spec.step_wait_ms or ""),
    }
