"""Kubernetes actuator: applies the controller's pool sizes to a KServe LLMInferenceService.

The controller decides (pure policy, elsewhere); an actuator applies. On the Helm chart's
RayService the controller scales through Serve (`serve_actuator.ServePoolActuator`) and KubeRay's
in-tree autoscaler adds and removes the worker pods the replicas need: nothing here touches a
RayService (KubeRay leaves worker-group `replicas` out of a RayService's update hash, so patching
them never changed a pod). This module scales what KServe honours on an LLMInferenceService
(`--target llmisvc`): `spec.replicas` (decode) and `spec.prefill.replicas`. An object (or a
workload) with a `scaling` section is KServe's own autoscaler's to size (its CRD makes `replicas`
and `scaling` mutually exclusive), and is left alone.

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
        already did); False when nothing was applied (changed by someone else, refused,
        or conflicts that outlasted the retries)."""
        ...


class ScaleRefused(Exception):
    """A scale request that must not be applied (the workload is sized by KServe's autoscaler)."""


@dataclass(frozen=True)
class ObjectRef:
    """Where the scaled object lives: API group/version, plural, namespace and name."""

    group: str
    version: str
    plural: str
    namespace: str
    name: str

    @classmethod
    def llm_inference_service(cls, namespace: str, name: str) -> ObjectRef:
        """A KServe LLMInferenceService (serving.kserve.io/v1alpha1)."""
        return cls("serving.kserve.io", "v1alpha1", "llminferenceservices", namespace, name)


# --- pure: read and patch an LLMInferenceService ----------------------------------------------

def llmisvc_replicas(obj: dict) -> dict[str, int]:
    """Pool replicas of an LLMInferenceService: decode inline, prefill under `spec.prefill`."""
    spec = obj["spec"]
    out = {"decode": int(spec.get("replicas", 1))}
    if spec.get("prefill") is not None:
        out["prefill"] = int(spec["prefill"].get("replicas", 1))
    return out


def llmisvc_patch(obj: dict, pool: str, replicas: int) -> dict:
    """Merge patch that sets `pool` to `replicas` in an LLMInferenceService.

    Raises KeyError for a pool the object does not deploy, ScaleRefused when KServe's own
    autoscaler sizes that workload (a `scaling` section: `replicas` must then stay unset).
    """
    if pool not in llmisvc_replicas(obj):
        raise KeyError(f"LLMInferenceService {obj['metadata']['name']} deploys no pool {pool!r}")
    workload = obj["spec"] if pool == "decode" else obj["spec"]["prefill"]
    if workload.get("scaling") is not None:
        raise ScaleRefused(f"{pool}: the LLMInferenceService's `scaling` section hands its "
                           "replicas to KServe's autoscaler")
    spec: dict[str, Any] = {"replicas": replicas}
    if pool == "prefill":
        spec = {"prefill": {"replicas": replicas}}
    return {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "spec": spec}


# --- the actuator -------------------------------------------------------------------------------

class KubernetesPoolActuator:
    """`PoolActuator` over one LLMInferenceService, through the `kubernetes` client.

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
        if ref.plural != "llminferenceservices":
            # A RayService's pods follow its Serve replicas (KubeRay's autoscaler): scale those
            # with `serve_actuator.ServePoolActuator` from inside the Ray cluster.
            raise ValueError(f"cannot scale {ref.plural}: only llminferenceservices")
        self._read, self._patch = llmisvc_replicas, llmisvc_patch

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
