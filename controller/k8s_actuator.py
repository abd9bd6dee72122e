"""Kubernetes actuator: applies the controller's pool sizes to a RayService or LLMInferenceService.

The controller decides (pure policy, elsewhere); an actuator applies. This one scales the prefill
and decode pools of a splitserve deployment on Kubernetes:

- RayService (the Helm chart): a pool's size is its Serve deployment's `num_replicas` inside
  `spec.serveConfigV2` plus the matching worker group's `replicas` (one replica per pod), both
  set in one patch. Serve applies a `num_replicas`-only change in place, without restarts.
- LLMInferenceService (`--target llmisvc`): `spec.replicas` (decode) and `spec.prefill.replicas`.

Concurrency: every patch is a JSON merge patch that carries the `metadata.resourceVersion` it was
computed from, so the API server refuses it (409) if the object changed since it was read. On a
409 the actuator reads the object again: if only its status moved (same `metadata.generation`)
it retries; if its spec moved (someone else scaled or edited it) it does nothing and returns
False, so a human's or another controller's change is never overwritten. The same generation
check runs before the first write: a change made since this actuator last read or wrote the
object is also left alone (the next `current()` adopts it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import yaml

log = logging.getLogger(__name__)

POOLS = ("prefill", "decode")
MAX_CONFLICT_RETRIES = 5  # each retry follows a status-only change; more means a hot loop
REQUEST_TIMEOUT_S = 10.0  # one API call; the controller's next tick tries again


class PoolActuator(Protocol):
    """Applies pool sizes. Implementations never block for long and never raise on a refusal."""

    def current(self) -> dict[str, int]:
        """Replicas per deployed pool as the cluster has them now, e.g. {"prefill": 2, ...}."""
        ...

    def scale(self, pool: str, replicas: int) -> bool:
        """Set `pool` to `replicas`. True when the object now asks for that many (also when it
        already did); False when nothing was applied (changed by someone else, out of bounds,
        or conflicts that outlasted the retries)."""
        ...


class ScaleRefused(Exception):
    """A scale request that must not be applied (out of the object's bounds)."""


@dataclass(frozen=True)
class ObjectRef:
    """Where the scaled object lives: API group/version, plural, namespace and name."""

    group: str
    version: str
    plural: str
    namespace: str
    name: str

    @classmethod
    def rayservice(cls, namespace: str, name: str) -> ObjectRef:
        """A KubeRay RayService (ray.io/v1)."""
        return cls("ray.io", "v1", "rayservices", namespace, name)

    @classmethod
    def llm_inference_service(cls, namespace: str, name: str) -> ObjectRef:
        """A KServe LLMInferenceService (serving.kserve.io/v1alpha1)."""
        return cls("serving.kserve.io", "v1alpha1", "llminferenceservices", namespace, name)


# --- pure: read and patch one kind ------------------------------------------------------------

def _deployments(serve_config: dict) -> list[dict]:
    return [d for app in serve_config.get("applications", []) for d in app.get("deployments", [])]


def rayservice_replicas(obj: dict) -> dict[str, int]:
    """Pool replicas of a RayService: the pools' `num_replicas` in `spec.serveConfigV2`."""
    serve_config = yaml.safe_load(obj["spec"].get("serveConfigV2") or "") or {}
    return {d["name"]: int(d.get("num_replicas", 1))
            for d in _deployments(serve_config) if d.get("name") in POOLS}


def rayservice_patch(obj: dict, pool: str, replicas: int) -> dict:
    """Merge patch that sets `pool` to `replicas` in a RayService (Serve config + worker group).

    Raises KeyError for a pool the object does not deploy, ScaleRefused outside the worker
    group's [minReplicas, maxReplicas].
    """
    serve_config = yaml.safe_load(obj["spec"]["serveConfigV2"])
    targets = [d for d in _deployments(serve_config) if d.get("name") == pool]
    groups = [dict(g) for g in obj["spec"]["rayClusterConfig"].get("workerGroupSpecs", [])]
    mine = [g for g in groups if g.get("groupName") == pool]
    if not targets or not mine:
        raise KeyError(f"RayService {obj['metadata']['name']} deploys no pool {pool!r}")
    group = mine[0]
    low, high = int(group.get("minReplicas", 0)), int(group.get("maxReplicas", 2**31 - 1))
    if not low <= replicas <= high:
        raise ScaleRefused(f"{pool}: {replicas} replicas is outside the worker group's "
                           f"bounds [{low}, {high}]")
    for d in targets:
        d["num_replicas"] = replicas
    group["replicas"] = replicas
    return {
        "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve_config, sort_keys=False),
            # A merge patch replaces lists whole: send every group, only ours changed.
            "rayClusterConfig": {"workerGroupSpecs": groups},
        },
    }


def llmisvc_replicas(obj: dict) -> dict[str, int]:
    """Pool replicas of an LLMInferenceService: decode inline, prefill under `spec.prefill`."""
    spec = obj["spec"]
    out = {"decode": int(spec.get("replicas", 1))}
    if spec.get("prefill") is not None:
        out["prefill"] = int(spec["prefill"].get("replicas", 1))
    return out


def llmisvc_patch(obj: dict, pool: str, replicas: int) -> dict:
    """Merge patch that sets `pool` to `replicas` in an LLMInferenceService."""
    if pool not in llmisvc_replicas(obj):
        raise KeyError(f"LLMInferenceService {obj['metadata']['name']} deploys no pool {pool!r}")
    spec: dict[str, Any] = {"replicas": replicas}
    if pool == "prefill":
        spec = {"prefill": {"replicas": replicas}}
    return {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "spec": spec}


# --- the actuator -------------------------------------------------------------------------------

class KubernetesPoolActuator:
    """`PoolActuator` over one RayService or LLMInferenceService, through the `kubernetes` client.

    `api` is a `kubernetes.client.CustomObjectsApi`; each call gives up after
    `request_timeout_s`. Not thread-safe: one controller loop owns it.
    """

    def __init__(self, api: Any, ref: ObjectRef, *, max_retries: int = MAX_CONFLICT_RETRIES,
                 request_timeout_s: float = REQUEST_TIMEOUT_S):
        self._api = api
        self._ref = ref
        self._max_retries = max_retries
        self._timeout = request_timeout_s
        self._generation: int | None = None  # last spec generation this actuator read or wrote
        if ref.plural == "rayservices":
            self._read, self._patch = rayservice_replicas, rayservice_patch
        elif ref.plural == "llminferenceservices":
            self._read, self._patch = llmisvc_replicas, llmisvc_patch
        else:
            raise ValueError(f"cannot scale {ref.plural}")

    def _get(self) -> dict:
        r = self._ref
        return self._api.get_namespaced_custom_object(r.group, r.version, r.namespace, r.plural,
                                                      r.name, _request_timeout=self._timeout)

    def _apply(self, body: dict) -> dict:
        r = self._ref
        return self._api.patch_namespaced_custom_object(r.group, r.version, r.namespace, r.plural,
                                                        r.name, body,
                                                        _request_timeout=self._timeout)

    def current(self) -> dict[str, int]:
        """Replicas per pool; also adopts the object's generation as the baseline for `scale`."""
        obj = self._get()
        self._generation = _generation(obj)
        return self._read(obj)

    def scale(self, pool: str, replicas: int) -> bool:
        """See `PoolActuator.scale`. Raises ValueError for a negative count, KeyError for a pool
        the object does not deploy."""
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        from kubernetes.client.exceptions import ApiException

        for _attempt in range(self._max_retries + 1):
            obj = self._get()
            generation = _generation(obj)
            if self._generation is not None and generation != self._generation:
                log.warning("%s/%s changed by someone else (generation %s -> %s): not scaling "
                            "%s; re-read it", self._ref.plural, self._ref.name,
                            self._generation, generation, pool)
                self._generation = generation
                return False
            self._generation = generation
            if self._read(obj).get(pool) == replicas:
                return True
            try:
                body = self._patch(obj, pool, replicas)
            except ScaleRefused as err:
                log.warning("not scaling: %s", err)
                return False
            try:
                result = self._apply(body)
            except ApiException as err:
                if err.status != 409:
                    raise
                log.info("conflict scaling %s on %s: retrying", pool, self._ref.name)
                continue
            self._generation = _generation(result) if result else None
            log.info("scaled %s of %s to %d", pool, self._ref.name, replicas)
            return True
        log.warning("gave up scaling %s of %s after %d conflicts", pool, self._ref.name,
                    self._max_retries + 1)
        return False


def _generation(obj: dict) -> int | None:
    gen = (obj.get("metadata") or {}).get("generation")
    return int(gen) if gen is not None else None
