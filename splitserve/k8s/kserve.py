"""KServe resources for a splitserve config (pure; built with the `kserve` SDK's typed models).

Two ways to serve through KServe:

- `inferenceservice`: a `ServingRuntime` whose container runs `splitserve serve` (router, prefill
  and decode pools in one pod, a local Ray cluster inside it) and a v1beta1 `InferenceService`
  that selects it and carries the config. Fits a config whose pools fit on one node.
- `llmisvc`: a v1alpha1 `LLMInferenceService`: KServe (with llm-d) runs the vLLM pools itself;
  the decode workload inline, `prefill` when disaggregated, `parallelism` from each pool.

Each function returns the manifest as a plain dict (camelCase keys), serialized with
`kserve.api_client.ApiClient().sanitize_for_serialization`. The SDK has no class for the
LLMInferenceService spec, so that spec is a plain mapping inside the typed outer object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from splitserve.config import PoolConfig, SplitserveConfig
from splitserve.k8s.fabric import FabricValues, fabric_pod
from splitserve.k8s.layout import (
    GPU_RESOURCE,
    KSERVE_MODEL_DIR,
    KSERVE_PORT,
    is_storage_uri,
    k8s_device,
    model_uri,
)

RUNTIME_FORMAT = "splitserve"  # the model format the ServingRuntime serves
CONFIG_ENV = "SPLITSERVE_CONFIG"  # the config YAML, written to a file before `splitserve serve`
CONFIG_FILE = "/tmp/splitserve.yaml"
READY_PATH = "/health/ready"  # readiness and startup probes (router/readiness.py)
LIVE_PATH = "/health/live"  # liveness probe: the router answers, no pool is pinged
PROBE_TIMEOUT_S = 5  # each probe's timeout: keep router.health_timeout_s (2 s) below it
SERVE_COMMAND = (
    f'printf "%s" "${CONFIG_ENV}" > {CONFIG_FILE} && '
    f"exec splitserve serve -c {CONFIG_FILE} --host 0.0.0.0 --port {KSERVE_PORT}"
)


SHM_VOLUME = "dshm"  # emptyDir (medium Memory) at /dev/shm when a pool runs TP > 1 (NCCL)
HF_TOKEN_ENV = "HF_TOKEN"
# What stopping Serve, the engines and Ray may take after `splitserve serve`'s drain: a bound on
# the pod's termination, not a measurement (about 10 s with the tiny model on two CPU cores).
TEARDOWN_MARGIN_S = 30


@dataclass
class PodOptions:
    """Pod settings the chart's values give both deploy modes (camelCase Kubernetes dicts).

    `env`, `image_pull_secrets`, `volumes`, `volume_mounts`: as the values `env`,
    `imagePullSecrets`, `extraVolumes`, `extraVolumeMounts`; `hf_token_secret`: the value
    `hfTokenSecret` ({name, key}; an `HF_TOKEN` env from that Secret when `name` is set);
    `shm_size`: `workers.shmSize`; `scheduling`: role -> {nodeSelector, tolerations, affinity}
    from `workers.<role>` (the single InferenceService pod takes decode's); `fabric`: the
    `kvFabric` values, for the LLMInferenceService's workloads (the InferenceService runs both
    pools in one pod: no KV crosses pods).
    """

    env: list[dict] = field(default_factory=list)
    image_pull_secrets: list[dict] = field(default_factory=list)
    volumes: list[dict] = field(default_factory=list)
    volume_mounts: list[dict] = field(default_factory=list)
    hf_token_secret: dict | None = None
    shm_size: str = "16Gi"
    scheduling: dict[str, dict] = field(default_factory=dict)
    fabric: FabricValues = field(default_factory=FabricValues)

    @classmethod
    def from_values(cls, values: dict) -> PodOptions:
        workers = values.get("workers") or {}
        scheduling = {}
        for role in ("prefill", "decode"):
            group = workers.get(role) or {}
            scheduling[role] = {k: group[k] for k in ("nodeSelector", "tolerations", "affinity")
                                if group.get(k)}
        return cls(env=list(values.get("env") or []),
                   image_pull_secrets=list(values.get("imagePullSecrets") or []),
                   volumes=list(values.get("extraVolumes") or []),
                   volume_mounts=list(values.get("extraVolumeMounts") or []),
                   hf_token_secret=values.get("hfTokenSecret") or None,
                   shm_size=str(workers.get("shmSize", "16Gi")),
                   scheduling=scheduling, fabric=FabricValues.from_values(values))

    def container_env(self) -> list[dict]:
        env = [dict(e) for e in self.env]
        secret = self.hf_token_secret or {}
        if secret.get("name"):
            env.append({"name": HF_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
                "name": secret["name"], "key": secret.get("key") or "token"}}})
        return env

    def mounts(self, shm: bool) -> list[dict]:
        own = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}] if shm else []
        return own + [dict(m) for m in self.volume_mounts]

    def pod_volumes(self, shm: bool) -> list[dict]:
        own = ([{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": self.shm_size}}]
               if shm else [])
        return own + [dict(v) for v in self.volumes]

    def pod_fields(self, role: str, shm: bool) -> dict:
        """imagePullSecrets, scheduling and volumes of a pod spec, empty ones left out."""
        out: dict[str, Any] = {}
        if self.image_pull_secrets:
            out["imagePullSecrets"] = [dict(s) for s in self.image_pull_secrets]
        out.update(self.scheduling.get(role, {}))
        if vols := self.pod_volumes(shm):
            out["volumes"] = vols
        return out


def _serialize(obj: Any) -> dict:
    from kserve.api_client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def _meta(name: str, namespace: str | None, labels: dict[str, str] | None = None,
          annotations: dict[str, str] | None = None):
    from kubernetes.client import V1ObjectMeta

    return V1ObjectMeta(name=name, namespace=namespace, labels=labels or None,
                        annotations=annotations or None)


def _resources(cfg: SplitserveConfig, gpus: int, cpu: str, memory: str):
    from kubernetes.client import V1ResourceRequirements

    amounts = {"cpu": cpu, "memory": memory}
    if k8s_device(cfg) == "cuda":
        amounts[GPU_RESOURCE] = str(gpus)
    return V1ResourceRequirements(requests=dict(amounts), limits=dict(amounts))


def pod_config(cfg: SplitserveConfig, cpu: str) -> dict:
    """The config the InferenceService pod runs: listening on 0.0.0.0:8080 (KServe's port), the
    model read from KServe's storage mount when `model.path` is a storage URI, and the local Ray
    cluster sized to the pod's CPU limit (a container sees all of the node's cores)."""
    data = cfg.model_dump(mode="json")
    data["router"]["host"] = "0.0.0.0"
    data["router"]["port"] = KSERVE_PORT
    if is_storage_uri(cfg.model.path):
        data["model"]["path"] = KSERVE_MODEL_DIR
    if cpu.isdigit():
        data["ray"]["num_cpus"] = int(cpu)
    return data


def total_gpus(cfg: SplitserveConfig) -> int:
    """GPUs of one splitserve instance: every replica of every deployed pool, TP x PP each."""
    return sum(p.replicas * p.ranks for p in cfg.deployed_pools().values())


def serving_runtime(*, name: str, image: str, namespace: str | None = None,
                    labels: dict[str, str] | None = None) -> dict:
    """A ServingRuntime (v1alpha1) whose container runs `splitserve serve` on port 8080."""
    from kserve import (
        V1alpha1ServingRuntime,
        V1alpha1ServingRuntimeSpec,
        V1alpha1SupportedModelFormat,
    )
    from kubernetes.client import V1Container, V1ContainerPort, V1HTTPGetAction, V1Probe

    container = V1Container(
        name="kserve-container",
        image=image,
        command=["/bin/sh", "-c"],
        args=[SERVE_COMMAND],
        ports=[V1ContainerPort(container_port=KSERVE_PORT, name="http", protocol="TCP")],
        # ready while the router can serve (router/readiness.py: a short prefill pool is
        # "degraded", still ready); live while it answers. Timeouts above health_timeout_s.
        readiness_probe=V1Probe(
            http_get=V1HTTPGetAction(path=READY_PATH, port=KSERVE_PORT),
            period_seconds=10, timeout_seconds=PROBE_TIMEOUT_S, failure_threshold=3,
        ),
        liveness_probe=V1Probe(
            http_get=V1HTTPGetAction(path=LIVE_PATH, port=KSERVE_PORT),
            period_seconds=10, timeout_seconds=PROBE_TIMEOUT_S, failure_threshold=6,
        ),
        startup_probe=V1Probe(
            http_get=V1HTTPGetAction(path=READY_PATH, port=KSERVE_PORT),
            period_seconds=10, timeout_seconds=PROBE_TIMEOUT_S,
            failure_threshold=180,  # engines load for minutes on big models
        ),
    )
    runtime = V1alpha1ServingRuntime(
        api_version="serving.kserve.io/v1alpha1",
        kind="ServingRuntime",
        metadata=_meta(name, namespace, labels),
        spec=V1alpha1ServingRuntimeSpec(
            supported_model_formats=[
                V1alpha1SupportedModelFormat(name=RUNTIME_FORMAT, version="1", auto_select=True)
            ],
            multi_model=False,
            containers=[container],
        ),
    )
    return _serialize(runtime)


def termination_grace_period_s(cfg: SplitserveConfig) -> int:
    """The pod's terminationGracePeriodSeconds: `router.shutdown_grace_s` (the drain after
    SIGTERM) rounded up, plus `TEARDOWN_MARGIN_S` (pure; the chart's
    splitserve.terminationGracePeriodSeconds)."""
    return math.ceil(cfg.router.shutdown_grace_s) + TEARDOWN_MARGIN_S


def inference_service(cfg: SplitserveConfig, *, name: str, runtime: str,
                      namespace: str | None = None, cpu: str = "8", memory: str = "64Gi",
                      labels: dict[str, str] | None = None,
                      pod: PodOptions | None = None) -> dict:
    """An InferenceService (v1beta1) that runs `cfg` with the `runtime` ServingRuntime.

    Raw deployment mode (no Knative scale-to-zero: engines take minutes to load); one replica,
    since the pools inside it are sized by the config.
    """
    from kserve import (
        V1beta1InferenceService,
        V1beta1InferenceServiceSpec,
        V1beta1ModelFormat,
        V1beta1ModelSpec,
        V1beta1PredictorSpec,
    )
    from kubernetes.client import V1EnvVar

    model = V1beta1ModelSpec(
        model_format=V1beta1ModelFormat(name=RUNTIME_FORMAT),
        runtime=runtime,
        storage_uri=model_uri(cfg.model.path) if is_storage_uri(cfg.model.path) else None,
        env=[V1EnvVar(name=CONFIG_ENV, value=yaml.safe_dump(pod_config(cfg, cpu), sort_keys=False))],
        resources=_resources(cfg, total_gpus(cfg), cpu, memory),
    )
    isvc = V1beta1InferenceService(
        api_version="serving.kserve.io/v1beta1",
        kind="InferenceService",
        metadata=_meta(name, namespace, labels,
                       {"serving.kserve.io/deploymentMode": "RawDeployment"}),
        spec=V1beta1InferenceServiceSpec(
            predictor=V1beta1PredictorSpec(min_replicas=1, max_replicas=1, model=model)
        ),
    )
    out = _serialize(isvc)
    # The SDK's model spec is a container and defaults its name to "": leave the field out.
    if not out["spec"]["predictor"]["model"].get("name"):
        out["spec"]["predictor"]["model"].pop("name", None)
    pod = pod or PodOptions()
    shm = any(p.tensor_parallel_size > 1 for p in cfg.deployed_pools().values())
    predictor, container = out["spec"]["predictor"], out["spec"]["predictor"]["model"]
    predictor["terminationGracePeriodSeconds"] = termination_grace_period_s(cfg)
    container["env"] += pod.container_env()
    if mounts := pod.mounts(shm):
        container["volumeMounts"] = mounts
    predictor.update(pod.pod_fields("decode", shm))
    return out


def _workload(cfg: SplitserveConfig, role: str, image: str, cpu: str, memory: str,
              pod: PodOptions) -> dict:
    """One LLMInferenceService workload: replicas, parallelism and the vLLM container."""
    from kubernetes.client import V1Container

    pool: PoolConfig = getattr(cfg.pools, role)
    shm = pool.tensor_parallel_size > 1
    fabric = fabric_pod(cfg, pod.fabric)  # the KV path between the workloads' pods
    main = _serialize(V1Container(name="main", image=image,
                                  resources=_resources(cfg, pool.ranks, cpu, memory)))
    for amounts in main["resources"].values():
        amounts.update(fabric.resources)
    if env := pod.container_env() + fabric.env:
        main["env"] = env
    if mounts := pod.mounts(shm):
        main["volumeMounts"] = mounts
    if fabric.capabilities:
        main["securityContext"] = {"capabilities": {"add": list(fabric.capabilities)}}
    out: dict[str, Any] = {}
    if fabric.annotations:
        out["annotations"] = dict(fabric.annotations)
    return {
        **out,
        "replicas": pool.replicas,
        "parallelism": {"tensor": pool.tensor_parallel_size,
                        "pipeline": pool.pipeline_parallel_size},
        "template": {"containers": [main], **pod.pod_fields(role, shm), **fabric.pod_fields()},
    }


def llm_inference_service(cfg: SplitserveConfig, *, name: str, image: str,
                          namespace: str | None = None, cpu: str = "8", memory: str = "64Gi",
                          labels: dict[str, str] | None = None,
                          pod: PodOptions | None = None) -> dict:
    """An LLMInferenceService (v1alpha1) for `cfg`: decode inline, `prefill` when disaggregated.

    Raises ValueError when the model has no URI KServe can fetch (the built-in tiny model or a
    local directory); `splitserve k8s check` reports the same before rendering.
    """
    from kserve import V1alpha1LLMInferenceService

    uri = model_uri(cfg.model.path)
    if uri is None:
        raise ValueError(
            f"model.path {cfg.model.path!r}: an LLMInferenceService needs a model URI "
            "(a Hugging Face id, hf://, s3://, gs:// or pvc://)"
        )
    spec: dict[str, Any] = {
        "model": {"uri": uri, "name": cfg.model.name},
        **_workload(cfg, "decode", image, cpu, memory, pod or PodOptions()),
        # KServe-managed HTTPRoute, Gateway and llm-d scheduler (prefix- and P/D-aware).
        "router": {"route": {}, "gateway": {}, "scheduler": {}},
    }
    if cfg.mode == "disaggregated":
        spec["prefill"] = _workload(cfg, "prefill", image, cpu, memory, pod or PodOptions())
    svc = V1alpha1LLMInferenceService(
        api_version="serving.kserve.io/v1alpha1",
        kind="LLMInferenceService",
        metadata=_meta(name, namespace, labels),
        spec=spec,
    )
    return _serialize(svc)
