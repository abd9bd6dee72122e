"""Deployment config: one YAML file describes a whole splitserve deployment.

The pydantic models here are the user boundary (YAML, CLI flags, later Helm values). They reject
unknown keys and wrong types with a message that names the key. Everything downstream reads the
validated, frozen models; nothing re-parses YAML.

    cfg = load_config("deploy.yaml")          # or load_config(None) for the embedded default
    cfg = cfg.with_overrides(mode="colocated")
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
import typing
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from splitserve.models.uri import MODEL_PATH_PATTERN, parse_model_uri

Mode = Literal["disaggregated", "colocated"]
Device = Literal["auto", "cpu", "cuda"]


DECODE_MAX_NUM_SEQS = 128  # a decode engine's sequence slots unless configured (PoolsConfig)
# A CPU engine's message-queue recheck interval (PoolConfig.step_wait_ms): vLLM's busy-wait
# between the EngineCore and its worker cost colocated engines about a fifth of their decode
# speed on two shared cores (BENCHMARKS.md, session 10); a missed wake-up costs at most this long.
STEP_WAIT_MS = 2


class _Strict(BaseModel):
    """Base for every config section: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ModelConfig(_Strict):
    """Which model is served and how the engine loads it."""

    name: str = Field("splitserve-tiny", description="Served model id; clients pass it as `model`.")
    path: str | None = Field(
        None,
        description="The model: hf://ORG/NAME[@REVISION] (or a plain hub id ORG/NAME), "
        "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX (read from the model cache the download step "
        "fills), pvc://CLAIM/PATH (the claim the Helm chart mounts) or a local directory. None: "
        "the built-in tiny model, built on first use.",
        # the values schema refuses another scheme at `helm install` (the validator below says why)
        json_schema_extra={"pattern": MODEL_PATH_PATTERN},
    )
    max_model_len: int = Field(2048, gt=0, description="Context length (prompt + output tokens).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    seed: int = 0
    tiny_variant: int = Field(
        0, ge=0, le=1000,
        description="Built-in tiny model only (path null): another number draws other weights "
        "(same shape and tokenizer), e.g. a second model or a new version for tests.",
    )
    tool_call_parser: str | None = Field(
        None,
        description="vLLM's tool-call parser of the model family (vLLM's `--tool-call-parser`, "
        "e.g. hermes, llama3_json, mistral, qwen3_coder); it also turns on `tool_choice: auto` "
        "(`--enable-auto-tool-choice`). vLLM 0.32 refuses every tool_choice without one. None: "
        "the built-in tiny model's `pythonic` when model.path is null, else no tool calls.",
    )
    reasoning_parser: str | None = Field(
        None,
        description="vLLM's reasoning parser of the model family (vLLM's `--reasoning-parser`, "
        "e.g. deepseek_r1, qwen3): the reasoning goes to `reasoning_content`. None: off.",
    )
    chat_template: str | None = Field(
        None,
        description="A chat template (a file path or the template itself) instead of the model's "
        "own (vLLM's `--chat-template`).",
    )

    @field_validator("path")
    @classmethod
    def _path_is_a_model_uri(cls, path: str | None) -> str | None:
        if path is not None:
            parse_model_uri(path)  # ModelURIError (a ValueError) names the problem
        return path


class PoolConfig(_Strict):
    """One worker pool (prefill or decode): replicas, parallelism and per-engine resources."""

    replicas: int = Field(1, ge=1, le=1024)
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    pipeline_parallel_size: int = Field(1, ge=1, le=64)
    max_num_seqs: int = Field(
        64, ge=1,
        description="Concurrent sequences per engine (unset: 64 for prefill, "
        f"{DECODE_MAX_NUM_SEQS} for decode, whose engines carry every stream).",
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1,
        description="Tokens per engine step (vLLM's chunked-prefill budget): a longer prompt is "
        "prefilled over several steps, between which the engine's streams decode. At least "
        "max_num_seqs. None: vLLM's default (2048 on the CPU).",
    )
    kv_cache_gib: int = Field(
        1, ge=1, description="CPU only: KV cache space per engine in GiB (VLLM_CPU_KVCACHE_SPACE)."
    )
    kv_cache_blocks: int | None = Field(
        None, ge=1,
        description="KV blocks per engine instead of what its memory holds (vLLM's "
        "num_gpu_blocks_override): a smaller cache, e.g. to exercise eviction and the KV tier. "
        "None: as many as fit.",
    )
    step_wait_ms: int = Field(
        STEP_WAIT_MS, ge=0, le=1000,
        description="CPU only: the engine's scheduler and its model worker wait for each other "
        "asleep on vLLM's message queue, rechecking every this many ms, instead of busy-waiting "
        "(vLLM spins for 1 s after every message, taking CPU from the engines' compute on "
        "shared cores). 0: vLLM's busy-wait.",
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="GPU only.")
    block_size: int | None = Field(None, ge=1, description="KV block size; None: engine default.")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"] = "auto"
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        "fcfs",
        description="vLLM's scheduling policy: fcfs, or priority, in which a request's "
        "`priority` (lower first) orders the engine's queue (vLLM refuses `priority` under fcfs).",
    )

    @model_validator(mode="after")
    def _step_budget(self) -> PoolConfig:
        budget = self.max_num_batched_tokens
        if budget is not None and budget < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({budget}) must be at "
                             f"least max_num_seqs ({self.max_num_seqs}): one token per sequence "
                             "per step")
        return self

    @property
    def ranks(self) -> int:
        """Engine ranks (processes) per replica: TP x PP."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


class PoolsConfig(_Strict):
    """The two pools. In colocated mode only `decode` is deployed and does both phases.

    A decode engine's `max_num_seqs` defaults to `DECODE_MAX_NUM_SEQS`: in a disaggregated
    deployment it decodes every stream that a colocated engine would share with its peers, and
    its sequence slots (the decode gate's capacity) were what capped goodput on decode-heavy
    load (BENCHMARKS.md, session 8), not its step time.
    """

    prefill: PoolConfig = PoolConfig()
    decode: PoolConfig = PoolConfig(max_num_seqs=DECODE_MAX_NUM_SEQS)

    @field_validator("decode")
    @classmethod
    def _decode_seqs(cls, pool: PoolConfig) -> PoolConfig:
        if "max_num_seqs" in pool.model_fields_set:
            return pool
        return PoolConfig(**{**pool.model_dump(), "max_num_seqs": DECODE_MAX_NUM_SEQS})


ModelId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$")]


class LoraAdapterConfig(_Strict):
    """A LoRA adapter of a served model, declared in the config (more can be loaded at run time
    through `POST /v1/admin/lora`). Clients pass its `name` as `model`."""

    name: ModelId
    path: str = Field(description="Directory with adapter_config.json and the adapter weights.")


class LoraConfig(_Strict):
    """LoRA adapters on one served model (`splitserve.router.adapters`). Every engine of the
    model's pools is started with LoRA on; each request names its adapter to every engine it
    visits, so a prefill and a decode worker always run it with the same weights."""

    max_loras: int = Field(
        2, ge=1, le=64,
        description="Adapters resident in each engine at once (vLLM max_loras and max_cpu_loras); "
        "one more is loaded by evicting the least recently used idle one.",
    )
    max_lora_rank: int = Field(16, ge=1, le=512, description="Largest adapter rank accepted.")
    adapters: tuple[LoraAdapterConfig, ...] = ()


class ServedModelConfig(_Strict):
    """One model of a several-model deployment (`models:`): its engine and its own pools."""

    model: ModelConfig
    mode: Mode | None = Field(None, description="None: the deployment's top-level `mode`.")
    pools: PoolsConfig = PoolsConfig()
    lora: LoraConfig | None = Field(None, description="None: no LoRA adapters on this model.")


class AliasTarget(_Strict):
    """One version behind an alias and its share of the alias's requests."""

    model: ModelId
    weight: float = Field(gt=0, description="Relative share; the shares need not sum to 1 or 100.")


class AliasConfig(_Strict):
    """A model id that maps to one or more served models, split by weight (canary rollout).

    A request with a `user` goes to the same target every time (a seeded hash of the user);
    without one, the split is per request (`splitserve.router.catalog.pick_target`).
    """

    name: ModelId
    targets: tuple[AliasTarget, ...] = Field(min_length=1)
    seed: int = Field(0, description="Changes which users land on which target.")


RoutingPolicyName = Literal["round_robin", "least_loaded", "prefix_aware", "kv_events"]


class RoutingConfig(_Strict):
    """Which replica of a pool gets a request (`splitserve.router.routing`), chosen per pool."""

    prefill: RoutingPolicyName = Field(
        "kv_events",
        description="Prefill cost is the uncached prompt: route to cached prefixes (kv_events: "
        "what the engines report they hold; prefix_aware: what the router sent where).",
    )
    decode: RoutingPolicyName = Field(
        "kv_events",
        description="Decode also prefills short or colocated prompts; the cost counts its load.",
    )
    kv_events: bool = Field(
        True,
        description="Engines publish vLLM's KV cache events (ZMQ) and each router indexes them "
        "per pool: the kv_events policy and the disaggregation rule's expected cached tokens "
        "read that index.",
    )
    block_size: int = Field(
        16, ge=1, le=4096,
        description="prefix_aware only: tokens per hashed block; best equal to the engine's "
        "(kv_events uses the engines' own block size and hashes).",
    )
    index_max_blocks: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="LRU bound of each pool's approximate prefix index, in block hashes. auto: "
        "2 x the pool's KV capacity as the engines report it (KV tokens per engine x replicas, "
        "at most max_replicas, / block_size; `splitserve.router.routing.index_size`); an integer "
        "sets it (about 330 bytes an entry).",
    )
    overlap_weight: float = Field(
        1.0, ge=0, description="Cost of one uncached block relative to one active decode block."
    )
    balance_factor: float = Field(
        2.0, ge=1, description="A replica with more than this times the least queue is overloaded."
    )
    balance_min_gap: int = Field(
        8, ge=0, description="...and more than this many queued requests above the least one."
    )

    @model_validator(mode="after")
    def _events_for_kv_policy(self) -> RoutingConfig:
        if not self.kv_events and "kv_events" in (self.prefill, self.decode):
            raise ValueError("the kv_events routing policy needs router.routing.kv_events: true")
        return self

    @field_validator("index_max_blocks", mode="before")
    @classmethod
    def _auto_or_count(cls, v: Any) -> Any:
        # One message instead of one per member of the union (and no True taken as 1).
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            return v
        raise ValueError("must be 'auto' or a whole number of blocks >= 1")


class StreamingConfig(_Strict):
    """How many tokens a streamed chunk carries (adaptive coalescing, `router/coalescing.py`).

    Every streamed chunk crosses the engine replica, the router and the HTTP proxy, and each
    crossing costs host CPU per chunk, not per token. Under load the router asks the engine for
    one chunk per `ceil(streams per replica / chunks_per_step)` tokens of a request, at most
    `max_tokens_per_chunk` (vLLM's per-request `stream_interval`): an engine decoding many
    streams then emits about `chunks_per_step` chunks per step instead of one per stream. The
    first token and the last are always sent at once, so TTFT and the end of a request do not
    change; between them a stream arrives in bursts of up to that many tokens.
    """

    max_tokens_per_chunk: int = Field(
        4, ge=1, le=64,
        description="Most tokens in one streamed chunk; 1: every token is its own chunk.",
    )
    chunks_per_step: int = Field(
        8, ge=1,
        description="Up to this many streams per engine replica, every token is its own chunk.",
    )
    transport: Literal["http", "ray"] = Field(
        "http",
        description="How a response's chunks reach the router from the engine replica: 'http', "
        "one HTTP response per request from the replica's stream server "
        "(splitserve/engine/stream_server.py; the replica listens on the address its peers "
        "reach it at); 'ray', one Ray object per chunk (more host CPU per token).",
    )


class RouterConfig(_Strict):
    """The HTTP ingress."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    replicas: int = Field(1, ge=1)
    direct_ingress: bool = Field(
        False,
        description="Ray Serve's direct ingress (splitserve/ingress.py): HAProxy, started by "
        "Serve, listens on host:port and forwards to the router replicas, which serve HTTP "
        "themselves; streamed chunks skip Serve's Python proxy. Off by default for now: Ray "
        "2.60's HAProxy template binds its statistics and Prometheus ports on every interface, "
        "and no quiet-machine run has yet shown the gain (BENCHMARKS.md, issue 26). Applies to "
        "a Ray cluster splitserve starts; a running cluster (ray.address) takes it from its "
        "own environment (RAY_SERVE_ENABLE_HA_PROXY=1).",
    )
    direct_streaming: bool = Field(
        False,
        description="The decode replicas answer clients themselves (splitserve/engine/front.py, "
        "docs/dataplane.md): the decode pool is the HTTP ingress behind Serve's HAProxy, and "
        "the router, Serve's ingress request router, only authenticates, admits, runs the "
        "disaggregation decision and a remote prefill, and picks the replica for each request "
        "(router/direct.py); no token crosses the router. Needs direct_ingress; one model, for "
        "now. Without the router in the token path "
        "a request is not retried or migrated after it reached its replica, and the router's "
        "decode span and inter-token latency do not cover it (its root span, request log and "
        "request metrics end when the replica settles it).",
    )
    max_body_bytes: int = Field(1 << 20, gt=0, description="Larger request bodies get HTTP 413.")
    request_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Deadline of one request from its arrival, admission queues included: past "
        "it the request is cancelled in every pool and the client gets 504 (an error event if "
        "it is already streaming).",
    )
    health_timeout_s: float = Field(2.0, gt=0)
    shutdown_grace_s: float = Field(
        20.0,
        ge=0,
        le=3600,
        description="On SIGTERM or Ctrl-C, `splitserve serve` refuses new requests (503) and "
        "gives those in flight this long to finish; then a stream ends with an error event, a "
        "whole response is a 503, and Serve, the engines and Ray stop. The chart sets the pods' "
        "terminationGracePeriodSeconds to this plus a teardown margin.",
    )
    decode_migrations: int = Field(
        1,
        ge=0,
        le=4,
        description="Times a request whose decode replica fails is continued on another decode "
        "replica (prompt + the tokens already streamed); then the client gets the error.",
    )
    routing: RoutingConfig = RoutingConfig()
    streaming: StreamingConfig = StreamingConfig()


class DisaggregationConfig(_Strict):
    """Where each request's prompt is prefilled, and how a remote prefill is retried.

    `prefill: auto` (the default) applies one rule per request (router/policy.py): the path
    (remote prefill then KV handoff, the whole request on a decode replica, or on a prefill
    replica) with the lowest predicted time to first token that keeps `slo.tpot_ms`. Its inputs
    are measured while serving: the engines' step costs, the handoff's latency, the pools' queues
    and their prefix caches. Nothing here is a hardware calibration.
    """

    prefill: Literal["auto", "remote", "local"] = Field(
        "auto",
        description="auto: the rule above. remote: every request that can be disaggregated "
        "prefills in the prefill pool (the decode worker still prefills when the prefill pool "
        "fails). local: every request runs whole on a decode replica (the prefill pool idles).",
    )
    min_remote_prompt_tokens: int = Field(
        0,
        ge=0,
        description="An optional floor: prompts with fewer tokens than this run whole on a "
        "decode replica whatever the rule predicts. 0 (the default): no floor.",
    )
    prefill_attempts: int = Field(
        2, ge=1, le=8,
        description="Tries of a remote prefill, each steered away from the replicas that failed; "
        "then the decode worker prefills locally.",
    )
    prefill_timeout_s: float = Field(
        30.0, gt=0,
        description="Deadline of all remote-prefill tries of one request together; past it, the "
        "decode worker prefills locally.",
    )
    kv_lease_s: int = Field(
        30, ge=2,
        description="Seconds a prefill engine keeps a prompt's KV blocks for a decode worker that "
        "has not pulled them yet (vLLM's NIXL kv_lease_duration; decode heartbeats extend it once "
        "the request is in the decode engine). Decode recomputes a handoff older than about 3/4 "
        "of it instead of pulling blocks that may be gone.",
    )


FabricKind = Literal["tcp", "infiniband", "roce", "efa", "custom"]


class KvTransferConfig(_Strict):
    """The network a KV cache crosses between a prefill pod and a decode pod (NIXL).

    The kind picks NIXL's backend in every engine (LIBFABRIC for `efa`, UCX otherwise), what the
    Helm chart adds to the engine pods (UCX/libfabric environment, RDMA device resources,
    IPC_LOCK; the cluster-specific parts are the chart's `kvFabric` values:
    `splitserve.k8s.fabric`), the preflight's warning about TCP and the handoff cost
    `splitserve plan` predicts (`splitserve.controller.profiles.kv_fabric_link`). Engines on one
    machine exchange KV through local memory whatever the kind.
    """

    fabric: FabricKind = Field(
        "tcp",
        description="tcp: the pod network (no RDMA device in the pods; a 5k-token KV of an 8B "
        "model took 1.8 s over TCP against 3 ms over RDMA, ai-dynamo/dynamo PR 1314). "
        "infiniband, roce: RDMA through UCX (RoCE: set the chart's kvFabric.gidIndex); efa: AWS "
        "Elastic Fabric Adapter through NIXL's LIBFABRIC backend; custom: only what the chart's "
        "kvFabric values give, with bandwidth_gbps.",
    )
    bandwidth_gbps: float | None = Field(
        None, gt=0,
        description="The fabric's bandwidth for one GPU's KV shard in Gb/s, as the planner "
        "prices a handoff. None: the kind's nominal figure (docs/kubernetes.md, \"KV fabric\"); "
        "required with `custom`.",
    )

    @model_validator(mode="after")
    def _custom_bandwidth(self) -> KvTransferConfig:
        if self.fabric == "custom" and self.bandwidth_gbps is None:
            raise ValueError("kv_transfer: fabric custom needs bandwidth_gbps (Gb/s per GPU)")
        return self

    @property
    def nixl_backend(self) -> str:
        """NIXL's transport backend for this fabric (vLLM's `kv_connector_extra_config.backends`)."""
        return "LIBFABRIC" if self.fabric == "efa" else "UCX"

    @property
    def rdma(self) -> bool:
        """Whether KV between pods moves over RDMA (false: TCP, or `custom`, which says nothing)."""
        return self.fabric in ("infiniband", "roce", "efa")


class KvTierConfig(_Strict):
    """A second KV tier per engine beyond its own KV cache (vLLM's OffloadingConnector): blocks
    the engine evicts stay there, and a prompt that starts with them loads them back instead of
    computing them again. In disaggregated mode it is composed with the NIXL handoff (vLLM's
    MultiConnector, NIXL first). Every engine, prefill and decode, has its own tier of
    `size_gib`. (kv_transfer/tier.py; docs/kv-tier.md.)
    """

    medium: Literal["none", "cpu", "disk"] = Field(
        "none",
        description="none: no tier. cpu: an LRU pool in host memory (on a GPU, pinned host "
        "memory; on the CPU, host memory beyond VLLM_CPU_KVCACHE_SPACE). disk: that host pool "
        "in front of vLLM's file-system tier under `path`.",
    )
    size_gib: float | None = Field(
        None, gt=0,
        description="Host memory of the tier per engine in GiB (with disk: the pool in front of "
        "the disk; on a GPU host, and with disk, a file in /dev/shm). Required unless medium "
        "is none.",
    )
    path: str | None = Field(
        None,
        description="disk only: the directory of the block files (absolute; a node-local volume "
        "the engines on one node may share; vLLM neither bounds nor cleans it).",
    )

    @model_validator(mode="after")
    def _medium_needs(self) -> KvTierConfig:
        if self.medium != "none" and self.size_gib is None:
            raise ValueError(f"kv_tier: medium {self.medium} needs size_gib (host memory per "
                             "engine in GiB)")
        if self.medium == "disk" and not (self.path and self.path.startswith("/")):
            raise ValueError(f"kv_tier: medium disk needs an absolute path, got {self.path!r}")
        if self.medium != "disk" and self.path is not None:
            raise ValueError(f"kv_tier: path is for medium disk only (medium is {self.medium})")
        return self


class SLOConfig(_Strict):
    """Latency targets the controller sizes the pools against."""

    ttft_ms: float = Field(1000.0, gt=0, description="Time to first token, p90 target.")
    tpot_ms: float = Field(100.0, gt=0, description="Time per output token, p90 target.")


# `hash_api_key` output: "sha256$<salt>$<hex HMAC-SHA256(salt, key)>" (splitserve.router.tenancy).
API_KEY_HASH_PATTERN = r"^sha256\$[A-Za-z0-9._-]{8,128}\$[0-9a-f]{64}$"
ApiKeyHash = Annotated[str, StringConstraints(pattern=API_KEY_HASH_PATTERN)]


class QuotaConfig(_Strict):
    """Per-tenant limits; None means unlimited. Over a limit: HTTP 429 with Retry-After."""

    requests_per_minute: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(
        None, ge=1, description="Prompt + generated tokens; prompt + max_tokens is reserved."
    )
    max_concurrent_requests: int | None = Field(None, ge=1)
    max_tokens_per_request: int | None = Field(None, ge=1, description="Prompt + max_tokens.")


class TenantConfig(_Strict):
    """A tenant of the API (keys and quotas are enforced by the multi-tenant router)."""

    name: str
    weight: float = Field(1.0, gt=0)
    priority: int = Field(0, ge=0, le=100, description="A higher class is always served first.")
    enabled: bool = Field(True, description="A disabled tenant's keys get HTTP 403.")
    api_key_hashes: tuple[ApiKeyHash, ...] = Field(
        (), description="Output of `splitserve.router.tenancy.hash_api_key`; never a plain key."
    )
    quotas: QuotaConfig = QuotaConfig()
    allowed_models: tuple[str, ...] | None = Field(
        None,
        description="Model ids this tenant may use: served models, aliases and LoRA adapters, "
        "or shell-style patterns (`ft-*`). None: every model. Any other id is 404 "
        "`model_not_found` for this tenant, and `/v1/models` does not list it.",
    )


class TenancyConfig(_Strict):
    """Authentication, fair admission and its queues (`splitserve.router.tenancy`)."""

    open_mode: bool = Field(
        True, description="With no tenants configured, serve every request as tenant `default` "
        "without a key. Ignored (off) as soon as any tenant is configured.",
    )
    tenants_file: str | None = Field(
        None, description="A YAML list of tenants (e.g. a Kubernetes Secret mount), added to "
        "`tenants`.",
    )
    admin_key_hashes: tuple[ApiKeyHash, ...] = Field(
        (), description="Hashes of the admin keys that may read `GET /v1/usage` (made like a "
        "tenant's, with `python -m splitserve.router.tenancy`); empty: the endpoint is off (404).",
    )
    prompt_token_weight: float = Field(1.0, gt=0, description="VTC w_p per prompt token.")
    output_token_weight: float = Field(
        2.0, gt=0, description="VTC w_q per generated token (decode costs more per token)."
    )
    max_queued: int = Field(1024, ge=1, description="Waiting requests per pool gate: then 429.")
    max_queued_per_tenant: int = Field(
        256, ge=1, description="Waiting requests per tenant per gate, so a flood fills only its own."
    )
    queue_timeout_s: float = Field(30.0, gt=0, description="Longest wait in a gate: then 503.")
    prefill_max_in_flight: int | None = Field(
        None, ge=1, description="None: replicas x max_num_seqs of the pool / router replicas."
    )
    decode_max_in_flight: int | None = Field(None, ge=1, description="As for prefill.")


class PlacementConfig(_Strict):
    """How engine ranks get cores on the CPU (GPUs are assigned by Ray)."""

    share_cores: bool = Field(
        False,
        description="Development and tests on small machines only: when cores run short, let "
        "engines share the least-used cores instead of failing. Never for production.",
    )


class FaultsConfig(_Strict):
    """Fault injection for tests and development only: every fault is off by default. Never set
    these in production. Each fault hits a fixed fraction of prompts, chosen by a seeded hash of
    the prompt's token ids, so that a test knows in advance which requests it hits
    (`splitserve.engine.faults`).
    """

    seed: int = Field(0, description="Selects which prompts each fault hits.")
    prefill_error_rate: float = Field(
        0.0, ge=0, le=1, description="Prompts whose prefill worker raises instead of prefilling."
    )
    prefill_delay_s: float = Field(
        0.0, ge=0, le=600, description="A slow prefill engine: every prefill waits this long first."
    )
    kv_load_failure_rate: float = Field(
        0.0, ge=0, le=1,
        description="Remote-prefill prompts whose decode request names a dead NIXL peer: the "
        "connector's handshake fails and the decode engine recomputes the prompt.",
    )
    kv_load_delay_rate: float = Field(
        0.0, ge=0, le=1, description="Remote-prefill prompts whose KV pull is delayed..."
    )
    kv_load_delay_s: float = Field(
        0.0, ge=0, le=600,
        description="...by this long, in the decode worker before its engine sees the request.",
    )

    @property
    def active(self) -> bool:
        """Whether any fault is configured (a delay needs both its rate and its duration)."""
        return any((self.prefill_error_rate, self.prefill_delay_s, self.kv_load_failure_rate,
                    self.kv_load_delay_rate and self.kv_load_delay_s))


class RayConfig(_Strict):
    """How `splitserve serve` starts or joins a Ray cluster."""

    address: str | None = Field(None, description="Join this cluster; None: RAY_ADDRESS or local.")
    num_cpus: int | None = Field(None, ge=1, description="Local cluster only; None: all cores.")
    object_store_mb: int = Field(256, ge=64, description="Local cluster object store cap.")
    one_event_loop: bool = Field(
        True,
        description="Each Serve replica runs its code and its deployment handles' request "
        "router on its main event loop (Ray Serve's throughput settings "
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0, RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0): "
        "no hop between threads per request and per streamed item. false: Serve's default "
        "(separate loops). Applies to a Ray cluster splitserve starts; a running cluster "
        "(ray.address, the Helm chart's pods) takes it from its own environment.",
    )
    worker_niceness: int = Field(
        0, ge=0, le=19,
        description="The scheduling niceness of Ray's worker processes: every replica and the "
        "engines' processes they start (Ray's RAY_worker_niceness). 0, as for vLLM's own "
        "server: the serving processes are the node's main work and do not yield the CPU to "
        "every other process (an engine's step waits for its host thread). Ray's default, 15, "
        "is meant for batch work that must not starve Ray's own daemons. Applies to a Ray "
        "cluster splitserve starts and to the Helm chart's Ray pods.",
    )


class AutoscalingConfig(_Strict):
    """Controller autoscaling (`splitserve.controller.autoscale`); absent: fixed replicas.

    Bounds apply to each pool. `slo` sizes prefill for TTFT and decode for TPOT from the
    planner's per-replica capacity; `queue` is Ray Serve's ongoing-requests policy.
    """

    policy: Literal["slo", "queue"] = "slo"
    control_period_s: float = Field(5.0, gt=0, description="Seconds between two decisions.")
    upscale_cooldown_s: float = Field(15.0, ge=0)
    downscale_cooldown_s: float = Field(120.0, ge=0)
    warmup_samples: int = Field(
        2, ge=0, description="Samples ignored after a replica becomes ready (cold start)."
    )
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(64, ge=1)
    scale_to_zero: bool = Field(False, description="Allow 0 replicas after idle_to_zero_s idle.")
    idle_to_zero_s: float = Field(300.0, gt=0)
    target_ongoing_requests: float = Field(2.0, gt=0, description="`queue` policy only.")
    drain_timeout_s: float = Field(
        600.0, gt=0,
        description="Seconds a replica being removed gets to finish its requests (drain).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError("autoscaling: min_replicas exceeds max_replicas")
        return self


class AcceleratorConfig(_Strict):
    """The device kind `splitserve plan` and `simulate` size for (`controller.profiles`)."""

    name: Literal["h100-80gb", "h200-141gb", "a100-80gb", "cpu"] = "h100-80gb"
    devices_per_node: int | None = Field(None, ge=1, description="None: the profile's (8).")
    nodes: int | None = Field(None, ge=1, description="None: as many as the plan needs.")


class TracingConfig(_Strict):
    """OpenTelemetry tracing of requests in the router (`splitserve.router.tracing`); off by
    default, and then it costs nothing. A key left out (null) falls back to OpenTelemetry's
    standard environment variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_TRACES_SAMPLER`,
    `OTEL_SERVICE_NAME`, `OTEL_SDK_DISABLED`, ...; docs/observability.md, "Tracing from the
    OTEL_* environment") as the router replica's process sees them; a key given here wins."""

    enabled: bool | None = Field(
        None, description="Trace requests: one trace per request, from the router's root span "
        "through admission, the prefill tries and the decode hop. null: on when an OTLP endpoint "
        "is known (`otlp_endpoint`, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or "
        "OTEL_EXPORTER_OTLP_ENDPOINT). OTEL_SDK_DISABLED=true turns tracing off in any case.",
    )
    sample_ratio: float | None = Field(
        None, ge=0, le=1,
        description="Fraction of new traces recorded (ParentBased(TraceIdRatioBased)). A request "
        "with a W3C `traceparent` header follows its caller's sampling decision instead. null: "
        "OTEL_TRACES_SAMPLER (+ OTEL_TRACES_SAMPLER_ARG), by default parentbased_always_on "
        "(every trace).",
    )
    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP traces endpoint, e.g. http://otel-collector:4318/v1/traces. null: "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT (with "
        "OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, http/protobuf or grpc); none of them: spans are "
        "recorded but not exported.",
    )
    service_name: str | None = Field(
        None, min_length=1, description="The `service.name` resource attribute. null: "
        "OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES), else splitserve-router.",
    )
    file: str | None = Field(
        None,
        description="Also append every span to this file, one JSON object per line "
        "(`splitserve.router.span_file`): for tests and debugging on one machine, where no "
        "collector runs. Every router replica appends to the same path.",
    )


class ObservabilityConfig(_Strict):
    """Request logs and the metrics endpoints beyond the router's `/metrics`
    (docs/observability.md lists every metric and the log line)."""

    log_format: Literal["text", "json"] = Field(
        "text", description="`json`: every splitserve log record is one JSON object per line.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="The least severe splitserve record logged. `DEBUG` adds one line "
        "per disaggregation decision: each path's predicted TTFT, longest token gap and mean "
        "TPOT, and the pool load the rule saw.",
    )
    request_log: bool = Field(
        True, description="One log line per finished request (logger `splitserve.requests`): "
        "trace id, tenant, outcome, token counts and timings.",
    )
    log_prompts: bool = Field(
        False, description="Add the prompt text to the request log line. Off: prompts are never "
        "logged (they may hold personal data); turn on only to debug.",
    )
    controller_metrics_port: int | None = Field(
        None, ge=1, le=65535,
        description="With `autoscaling`: the controller actor serves its Prometheus `/metrics` "
        "(replica counts, scaling decisions) on this port. None: not served.",
    )
    router_metrics_port: int | None = Field(
        None, ge=1, le=65535,
        description="Serve the routers' Prometheus `/metrics` (per-tenant usage and refusals) "
        "on this port of the Ray head node, bound on `router.host`, every router replica's "
        "samples labelled `router_replica`; the API port's `/metrics` then answers 404. None: "
        "`/metrics` on the API port, each replica its own (one machine). The Helm chart sets it.",
    )
    engine_metrics: bool = Field(
        False, description="Engines export vLLM's own metrics (vllm:num_requests_running, "
        "kv_cache_usage_perc, prefix_cache_*, nixl_*) through Ray's metrics agent, like Ray "
        "Serve LLM's `log_engine_metrics`.",
    )


class SplitserveConfig(_Strict):
    """A whole deployment: model(s), mode, pools, router, tenants, SLOs.

    One model: `model` + `pools` (+ `lora`). Several: a `models:` list, each entry with its own
    model, mode and pools; `model`, `pools` and `lora` are then left out. `model_views()` gives
    one single-model config per served model either way: everything per model (engine specs,
    pool deployments, admission gates) is built from a view.
    """

    model: ModelConfig = ModelConfig()
    mode: Mode = "disaggregated"
    device: Device = "auto"
    pools: PoolsConfig = PoolsConfig()
    lora: LoraConfig | None = Field(None, description="LoRA adapters of `model`; None: off.")
    models: tuple[ServedModelConfig, ...] = Field(
        (), description="Several models in one deployment, each with its own pools; empty: the "
        "one `model` with `pools`.",
    )
    aliases: tuple[AliasConfig, ...] = Field(
        (), description="Model ids that map to served models by weight (canary rollout).",
    )
    router: RouterConfig = RouterConfig()
    disaggregation: DisaggregationConfig = DisaggregationConfig()
    kv_transfer: KvTransferConfig = Field(
        KvTransferConfig(), description="The network KV caches cross between prefill and "
        "decode pods (fabric kind and bandwidth).",
    )
    kv_tier: KvTierConfig = Field(
        KvTierConfig(), description="A KV tier per engine beyond its own KV cache (host memory "
        "or disk; none by default).",
    )
    slo: SLOConfig = SLOConfig()
    tenants: tuple[TenantConfig, ...] = ()
    tenancy: TenancyConfig = TenancyConfig()
    placement: PlacementConfig = PlacementConfig()
    ray: RayConfig = RayConfig()
    autoscaling: AutoscalingConfig | None = None
    accelerator: AcceleratorConfig | None = None
    faults: FaultsConfig = Field(
        FaultsConfig(), description="Tests and development only: fault injection (all off)."
    )
    tracing: TracingConfig = Field(
        TracingConfig(), description="OpenTelemetry tracing of requests (off by default, unless "
        "OpenTelemetry's environment names an OTLP endpoint).",
    )
    observability: ObservabilityConfig = Field(
        ObservabilityConfig(), description="Request logs and extra metrics endpoints."
    )

    @model_validator(mode="after")
    def _tenant_names_unique(self) -> SplitserveConfig:
        names = [t.name for t in self.tenants]
        if len(names) != len(set(names)):
            raise ValueError(f"tenants: duplicate tenant names in {names}")
        return self

    @model_validator(mode="after")
    def _models_consistent(self) -> SplitserveConfig:
        if self.models:
            if (self.model, self.pools, self.lora) != (ModelConfig(), PoolsConfig(), None):
                raise ValueError("with `models:`, give each model its own `model`, `pools` and "
                                 "`lora` there; leave the top-level ones out")
            if self.autoscaling is not None:
                raise ValueError("autoscaling: not supported with several `models` yet")
        check_model_ids(self)
        return self

    @model_validator(mode="after")
    def _direct_streaming_supported(self) -> SplitserveConfig:
        if not self.router.direct_streaming:
            return self
        if not self.router.direct_ingress:
            raise ValueError("router.direct_streaming needs router.direct_ingress: true")
        if self.models:
            raise ValueError("router.direct_streaming: one model only, for now")
        return self

    def model_views(self) -> tuple[SplitserveConfig, ...]:
        """One single-model config per served model, in order (the first is the primary one).

        A view is this config with `model`, `mode`, `pools` and `lora` of one model and no
        `models` or `aliases`: what engine specs, pool deployments and admission gates are
        built from. Without `models:` the only view is this config itself.
        """
        if not self.models:
            return (self,)
        return tuple(
            self.model_copy(update={
                "model": m.model, "mode": m.mode or self.mode, "pools": m.pools,
                "lora": m.lora, "models": (), "aliases": (),
            })
            for m in self.models
        )

    def deployed_pools(self) -> dict[str, PoolConfig]:
        """The pools this mode deploys, by role name."""
        if self.mode == "colocated":
            return {"decode": self.pools.decode}
        return {"prefill": self.pools.prefill, "decode": self.pools.decode}

    def with_overrides(self, **dotted: Any) -> SplitserveConfig:
        """A copy with `section.key=value` overrides applied (None values are skipped). An
        optional section that is off (`autoscaling: null`) is switched on by overriding a key in
        it, with defaults for the rest.

        >>> cfg.with_overrides(**{"router.port": 9000, "mode": "colocated"})
        """
        data = self.model_dump()
        for key, value in dotted.items():
            if value is None:
                continue
            *parents, leaf = key.split(".")
            node = data
            for p in parents:
                if p in node and node[p] is None and _optional_section(type(self), parents, p):
                    node[p] = {}
                if not isinstance(node.get(p), dict):
                    raise ConfigError(f"invalid override {key}: no config section {p!r}")
                node = node[p]
            node[leaf] = value
        return parse_config(data, "(with overrides)")


def check_model_ids(cfg: SplitserveConfig) -> None:
    """Model, adapter and alias ids are unique, and every alias target is a served model or an
    adapter (raises ValueError naming the id)."""
    served = [m.model for m in cfg.models] or [cfg.model]
    loras = [m.lora for m in cfg.models] if cfg.models else [cfg.lora]
    ids = [m.name for m in served]
    ids += [a.name for lora in loras if lora is not None for a in lora.adapters]
    ids += [a.name for a in cfg.aliases]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"model ids must be unique across models, adapters and aliases: {dupes}")
    targets = set(ids) - {a.name for a in cfg.aliases}
    for alias in cfg.aliases:
        for t in alias.targets:
            if t.model not in targets:
                raise ValueError(f"aliases: {alias.name!r} targets {t.model!r}, which is no "
                                 "served model or adapter")


def _optional_section(model: type[BaseModel], path: list[str], name: str) -> bool:
    """Whether `name` (a top-level key, the only place optional sections live) is a section
    that may be None, i.e. its field's type is a model or None."""
    field = model.model_fields.get(name) if path and path[0] == name else None
    if field is None:
        return False
    args = typing.get_args(field.annotation)
    return type(None) in args and any(isinstance(a, type) and issubclass(a, BaseModel)
                                      for a in args)


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate; the message names the key."""


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {loc}: unknown key")
        else:
            lines.append(f"  {loc}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<dict>") -> SplitserveConfig:
    """Validate a parsed YAML/JSON document; raise ConfigError naming each bad key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {source}: top level must be a mapping")
    try:
        return SplitserveConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def default_config_text() -> str:
    """The embedded default config (used when no file is given)."""
    return resources.files("splitserve").joinpath("default_config.yaml").read_text()


def load_config(path: str | Path | None) -> SplitserveConfig:
    """Load and validate a config file, or the embedded default when `path` is None."""
    if path is None:
        return parse_config(yaml.safe_load(default_config_text()), "<default>")
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config {p}: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid YAML in {p}: {err}") from None
    return parse_config(data, str(p))


def dump_config(cfg: SplitserveConfig) -> str:
    """The effective config as YAML (what `splitserve config show` prints)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
