"""Preflight: is a config deployable on a Kubernetes target? Checked before anything is applied.

`preflight(cfg, target, gpus_per_node=N)` returns findings (errors and warnings), each naming the
config key at fault and what to change. Pure: no cluster, no files. `splitserve k8s check` prints
them and exits non-zero on any error; `splitserve k8s render` refuses a config with errors.

Rules (one function each):
- placement: on CUDA one replica's TP x PP ranks run in one Ray actor on one node, so TP x PP
  must fit a node's GPUs (and, for the `kserve` target, every replica of both pools must fit
  the one pod); node GPUs left idle are a warning;
- P/D compatibility: the two pools must be able to exchange KV caches (same model, dtype, KV
  block size, TP sizes that divide each other, no pipeline parallelism with vLLM 0.32's NIXL
  connector, ...: `splitserve.kv_transfer.compat`; the PP rule is a warning for an
  LLMInferenceService, whose engines run KServe's vLLM image);
- device: pipeline parallelism is not supported on the CPU; the LLMInferenceService runs CUDA
  vLLM only;
- model: KServe needs a model it can fetch (a hub id or storage URI), not a local directory;
- model storage (helm): an s3:// or gs:// model is read from the model cache, so `modelCache`
  must be on; the chart's model mounts (/mnt/model-cache, /mnt/pvc/CLAIM) must not collide with
  `extraVolumeMounts`. A pvc:// model's claim is always mounted (by the chart, or by KServe);
- network: a loopback `router.host` is unreachable from the Service;
- KV transport: a disaggregated deployment on CUDA whose prefill and decode pools run in
  separate pods (the chart, an LLMInferenceService) moves every remote prefill's KV between
  pods; with `kv_transfer.fabric` tcp (the default) that is UCX over TCP on the pod network, a
  warning that names the key (two pods share no NVLink or CUDA IPC, even on one node);
- models: a several-model config (`models:`) is not rendered for Kubernetes yet (the KServe
  resources describe one model; the chart's worker groups are sized from one model's pools).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from splitserve.config import SplitserveConfig
from splitserve.engine.args import engine_spec
from splitserve.k8s.layout import (
    LOOPBACK_HOSTS,
    chart_model_mounts,
    is_local_path,
    k8s_device,
    model_uri,
)
from splitserve.kv_transfer.compat import (
    CompatibilityError,
    check_pd_compatible,
    nixl_pp_problems,
)

Target = Literal["helm", "kserve", "llmisvc"]
TARGETS: tuple[Target, ...] = ("helm", "kserve", "llmisvc")
DEFAULT_GPUS_PER_NODE = 8  # the common GPU node (8x A100/H100); pass the real number


@dataclass(frozen=True)
class Finding:
    """One problem: `level` error (blocks deploying) or warning; `key` is the config key."""

    level: Literal["error", "warning"]
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.key}: {self.message}"


def _placement(cfg: SplitserveConfig, target: Target, gpus_per_node: int) -> list[Finding]:
    out: list[Finding] = []
    if k8s_device(cfg) != "cuda":
        return out
    for role, pool in cfg.deployed_pools().items():
        key = f"pools.{role}"
        tp, pp, ranks = pool.tensor_parallel_size, pool.pipeline_parallel_size, pool.ranks
        if tp > gpus_per_node:
            out.append(Finding("error", f"{key}.tensor_parallel_size",
                               f"TP {tp} is more than the {gpus_per_node} GPUs of a node; "
                               "tensor parallelism needs the GPUs of one node"))
        elif ranks > gpus_per_node:
            out.append(Finding("error", key,
                               f"one replica needs TP x PP = {tp} x {pp} = {ranks} GPUs but a node "
                               f"has {gpus_per_node}; splitserve runs a replica's ranks on one "
                               "node (lower pipeline_parallel_size or use larger nodes)"))
        elif gpus_per_node % ranks:
            out.append(Finding("warning", key,
                               f"{ranks} GPUs per replica leave {gpus_per_node % ranks} of a "
                               f"node's {gpus_per_node} GPUs idle"))
    if target == "kserve":
        total = sum(p.replicas * p.ranks for p in cfg.deployed_pools().values())
        if total > gpus_per_node:
            out.append(Finding("error", "pools",
                               f"the InferenceService runs every replica of every pool in one pod: "
                               f"{total} GPUs, but a node has {gpus_per_node} (use the Helm chart "
                               "or --target llmisvc to spread pools over nodes)"))
    return out


def _compatibility(cfg: SplitserveConfig, target: Target) -> list[Finding]:
    if cfg.mode != "disaggregated":
        return []
    device = k8s_device(cfg)
    specs = {role: engine_spec(cfg, role, device) for role in ("prefill", "decode")}  # type: ignore[arg-type]
    # An LLMInferenceService runs KServe's vLLM image, not splitserve's vLLM 0.32: its NIXL
    # connector's pipeline-parallel limits are a warning there, an error where splitserve runs.
    own_engines = target != "llmisvc"
    out = []
    try:
        check_pd_compatible(specs["prefill"], specs["decode"], None, nixl_pp=own_engines)
    except CompatibilityError as err:
        out.append(Finding("error", "pools", str(err)))
    if not own_engines:
        out += [Finding("warning", "pools", f"{problem} (if KServe's vLLM image has the same "
                        "connector)")
                for problem in nixl_pp_problems(specs["prefill"].pipeline_parallel_size,
                                                specs["decode"].pipeline_parallel_size)]
    return out


def _device(cfg: SplitserveConfig, target: Target) -> list[Finding]:
    out = []
    device = k8s_device(cfg)
    if device == "cpu":
        for role, pool in cfg.deployed_pools().items():
            if pool.pipeline_parallel_size > 1 and cfg.mode == "colocated":
                out.append(Finding("error", f"pools.{role}.pipeline_parallel_size",
                                   "pipeline parallelism is not supported on the CPU"))
        if target == "llmisvc":
            out.append(Finding("error", "device",
                               "an LLMInferenceService runs the CUDA build of vLLM; set device: cuda"))
    return out


def _model(cfg: SplitserveConfig, target: Target) -> list[Finding]:
    path = cfg.model.path
    if target == "llmisvc" and model_uri(path) is None:
        what = "the built-in tiny model" if path is None else f"the local directory {path!r}"
        return [Finding("error", "model.path",
                        f"{what} cannot be served by an LLMInferenceService: give a Hugging Face "
                        "id or a storage URI (hf://, s3://, gs://, pvc://)")]
    if is_local_path(path):
        level = "error" if target == "kserve" else "warning"
        return [Finding(level, "model.path",
                        f"{path!r} is a path on this machine: the pods must see it too (bake it "
                        "into the image or mount a volume), or use a hub id or storage URI")]
    return []


# TCP between pods is 100x and more slower than RDMA for a KV cache: a 5k-token KV of Llama 3 8B
# took 1.8 s over TCP and 3 ms over RDMA (ai-dynamo/dynamo PR 1314). The estimate below prices
# this prompt length with the planner's TCP figure (controller/profiles.py, kv_fabric_link).
TCP_WARNING_PROMPT_TOKENS = 1024


def _kv_transport(cfg: SplitserveConfig, target: Target) -> list[Finding]:
    if cfg.mode != "disaggregated" or target == "kserve" or k8s_device(cfg) != "cuda":
        return []  # one pod (kserve), or no KV between pods, or a CPU dev cluster
    if cfg.kv_transfer.fabric != "tcp":
        return []
    said = "tcp" if "fabric" in cfg.kv_transfer.model_fields_set else "not set (tcp)"
    return [Finding("warning", "kv_transfer.fabric",
                    f"{said}: each remote prefill's KV cache moves from a prefill pod to a decode "
                    f"pod over TCP on the pod network (two pods share no NVLink or CUDA IPC, "
                    f"even on one node){_tcp_estimate(cfg)}; set kv_transfer.fabric to "
                    "infiniband, roce or efa and the chart's kvFabric values (docs/kubernetes.md, "
                    "\"KV fabric\")")]


def _tcp_estimate(cfg: SplitserveConfig) -> str:
    """", about N ms for a 1024-token prompt's KV (M MB)" for the config's model, or "" when its
    shape is unknown."""
    from splitserve.controller.profiles import TCP_KV_BW, ModelShapeError, model_shape

    try:
        shape = model_shape(cfg.model.path, cfg.model.name, cfg.model.dtype)
    except (ModelShapeError, OSError):
        return ""
    nbytes = TCP_WARNING_PROMPT_TOKENS * shape.kv_bytes_per_token
    return (f", about {1e3 * nbytes / TCP_KV_BW:.0f} ms for a {TCP_WARNING_PROMPT_TOKENS}-token "
            f"prompt's KV ({nbytes / 1e6:.0f} MB) at the {TCP_KV_BW / 1e9:.2f} GB/s measured over "
            "TCP")


def _model_storage(cfg: SplitserveConfig, target: Target, values: dict) -> list[Finding]:
    if target != "helm" or cfg.model.path is None:
        return []
    cache_on = bool((values.get("modelCache") or {}).get("enabled"))
    out = []
    if cfg.model.path.startswith(("s3://", "gs://")) and not cache_on:
        out.append(Finding("error", "modelCache.enabled",
                           f"model.path {cfg.model.path} is read from the chart's model cache, "
                           "which is off: set modelCache.enabled: true (its Job downloads the "
                           "model once, before the engines start)"))
    taken = {m.get("mountPath") for m in values.get("extraVolumeMounts") or []}
    for path, what in chart_model_mounts(cfg, cache_on).items():
        if path in taken:
            out.append(Finding("error", "extraVolumeMounts",
                               f"{path} is where the chart mounts the {what}; mount yours "
                               "elsewhere"))
    return out


def _network(cfg: SplitserveConfig, target: Target) -> list[Finding]:
    if target == "helm" and cfg.router.host in LOOPBACK_HOSTS:
        return [Finding("warning", "router.host",
                        f"{cfg.router.host} is unreachable from a Service; "
                        "`render --target helm-values` writes 0.0.0.0")]
    return []


def preflight(cfg: SplitserveConfig, target: Target = "helm", *,
              gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
              values: dict | None = None) -> list[Finding]:
    """Every finding for deploying `cfg` on `target` with nodes of `gpus_per_node` GPUs.
    `values`: the chart values it is installed with, besides `config` (None: the chart's
    defaults; the helm target's model-storage rules read modelCache and extraVolumeMounts)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    if gpus_per_node < 1:
        raise ValueError("gpus_per_node must be at least 1")
    if cfg.models:
        return [Finding("error", "models", "several models in one deployment run with "
                        "`splitserve serve` only; render one config per model for Kubernetes")]
    return [
        *_placement(cfg, target, gpus_per_node),
        *_compatibility(cfg, target),
        *_device(cfg, target),
        *_model(cfg, target),
        *_model_storage(cfg, target, values or {}),
        *_network(cfg, target),
        *_kv_transport(cfg, target),
    ]


def errors(findings: list[Finding]) -> list[Finding]:
    """Only the findings that block a deployment."""
    return [f for f in findings if f.level == "error"]
