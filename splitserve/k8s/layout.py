"""How a splitserve config maps onto Kubernetes: names, devices, model URIs (pure, no I/O).

Shared by the Helm chart's Python mirror (`chart.py`), the KServe renderers (`kserve.py`) and
the preflight (`preflight.py`). Each constant and rule is the one the chart templates use too;
`tests/k8s` renders the chart and checks they agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitserve.config import PoolConfig, SplitserveConfig
from splitserve.models.cache import MODEL_CACHE_MOUNT, PVC_MOUNT_ROOT
from splitserve.models.uri import URI_SCHEMES, kserve_uri, parse_model_uri

# Ray custom resource that pins a pool's replicas to its own worker group: each worker pod of
# group `prefill` advertises {"splitserve-prefill": 1}, each prefill replica asks for 1. Without
# it Ray could place a decode replica on a prefill pod (and a prefill pod's node selector,
# e.g. a compute-heavy GPU type, would mean nothing).
POOL_RESOURCE_PREFIX = "splitserve-"

# Where the chart mounts the API-key Secret; `tenancy.tenants_file` points at the file.
API_KEYS_DIR = "/etc/splitserve/api-keys"
API_KEYS_FILE = f"{API_KEYS_DIR}/tenants.yaml"

# KServe: the predictor container's port, and where its storage initializer puts the model.
KSERVE_PORT = 8080
KSERVE_MODEL_DIR = "/mnt/models"

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_IMAGE = "splitserve:0.1.0"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
STORAGE_SCHEMES = tuple(f"{s}://" for s in URI_SCHEMES)  # models/uri.py
# The model cache (values modelCache) and a pvc:// model's claim, as the chart mounts them in
# every Ray pod (templates/_models.tpl); models/cache.py reads them at these paths.
MODEL_CACHE_VOLUME = "model-cache"
MODEL_PVC_VOLUME = "model-pvc"


def k8s_device(cfg: SplitserveConfig) -> str:
    """The engine device on Kubernetes: `auto` means CUDA (a cluster install targets GPUs)."""
    return "cuda" if cfg.device == "auto" else cfg.device


def pool_resource(role: str) -> str:
    """The Ray custom resource that pins pool `role` to its worker group."""
    return f"{POOL_RESOURCE_PREFIX}{role}"


def pool_resources(cfg: SplitserveConfig) -> dict[str, dict[str, float]]:
    """`serve_config(pool_resources=...)` for the chart: one unit of the pool's resource each."""
    return {role: {pool_resource(role): 1} for role in cfg.deployed_pools()}


def gpus_per_replica(pool: PoolConfig) -> int:
    """GPUs one replica of a pool uses on CUDA: one per engine rank (TP x PP)."""
    return pool.ranks


def pods_per_replica(pool: PoolConfig) -> int:
    """Worker pods one replica of a pool needs: 1. A replica's TP x PP engine ranks run in one
    Ray actor on one pod (`preflight` refuses a replica larger than a node); engines spanning
    pods are not supported. The chart's `splitserve.podsPerReplica` is the same number."""
    return 1


@dataclass(frozen=True)
class GroupSize:
    """A RayService worker group's size: KubeRay's `replicas`, `minReplicas`, `maxReplicas`
    (pods), and whether KubeRay's autoscaler manages it."""

    replicas: int
    min_replicas: int
    max_replicas: int
    autoscaled: bool


def worker_group_size(cfg: SplitserveConfig, role: str) -> GroupSize:
    """The chart's worker group for pool `role` (mirrors the template in rayservice.yaml).

    With `autoscaling`, KubeRay's autoscaler adds and removes pods for the replicas Serve asks
    for, between the config's bounds times the pods a replica needs; the group starts with the
    pods of the pool's initial `replicas` (clamped to the bounds), so the first replicas do not
    wait for an autoscaler round. Without it the group is fixed at the pool's replicas.
    """
    pool = cfg.deployed_pools()[role]
    per = pods_per_replica(pool)
    auto = cfg.autoscaling
    if auto is None:
        n = pool.replicas * per
        return GroupSize(n, n, n, autoscaled=False)
    low, high = auto.min_replicas * per, auto.max_replicas * per
    return GroupSize(min(max(pool.replicas * per, low), high), low, high, autoscaled=True)


def chart_model_mounts(cfg: SplitserveConfig, model_cache: bool) -> dict[str, str]:
    """Mount path -> what the chart mounts there for the model in every Ray pod: the model
    cache (values modelCache.enabled) and a pvc:// model's claim (templates/_models.tpl)."""
    out = {MODEL_CACHE_MOUNT: "model cache"} if model_cache else {}
    if cfg.model.path is not None:
        uri = parse_model_uri(cfg.model.path)
        if uri.scheme == "pvc":
            out[f"{PVC_MOUNT_ROOT}/{uri.root}"] = f"claim {uri.root!r} of the pvc:// model"
    return out


def is_storage_uri(path: str | None) -> bool:
    """True for an explicit model URI (hf://, s3://, gs://, pvc://): KServe fetches it."""
    return bool(path) and path.startswith(STORAGE_SCHEMES)  # type: ignore[union-attr]


def is_local_path(path: str | None) -> bool:
    """True for a directory on some machine's disk (absolute, ./, ~/), not a hub id or URI."""
    return bool(path) and not is_storage_uri(path) and path.startswith(("/", ".", "~"))  # type: ignore[union-attr]


def model_uri(path: str | None) -> str | None:
    """A KServe model URI for `model.path` (`splitserve.models.uri.kserve_uri`): a hub id or
    hf:// URI as hf://ORG/NAME[:REVISION], s3/gs/pvc as they are.

    None when there is none: the built-in tiny model (path None) or a local directory.
    """
    return None if path is None else kserve_uri(parse_model_uri(path))
