"""The controller's Kubernetes actuator against kmock's Kubernetes emulator (with the API server's
resourceVersion/generation semantics added, see emulator.py), through the real `kubernetes`
client. The LLMInferenceService under test is the one `splitserve k8s render` writes.

A RayService is not scaled here at all: its pods follow its Serve replicas through KubeRay's
autoscaler (test_chart.py), so no code patches worker-group replicas."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client
from splitserve.controller import k8s_actuator
from splitserve.controller.k8s_actuator import KubernetesPoolActuator, ObjectRef

from splitserve.config import parse_config
from splitserve.k8s.render import render
from tests.k8s.emulator import ConcurrentEmulator, running_emulator

NS = "llm"
LLM = ObjectRef.llm_inference_service(NS, "llama")


@pytest.fixture(scope="module")
def llmisvc_manifest() -> dict:
    cfg = parse_config({"model": {"name": "llama", "path": "org/llama"}, "device": "cuda",
                        "pools": {"prefill": {"replicas": 2}, "decode": {"replicas": 3}}})
    return yaml.safe_load(render(cfg, "llmisvc", name="llama")["llminferenceservice.yaml"])


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[ConcurrentEmulator, client.CustomObjectsApi]]:
    with running_emulator() as (em, url):
        conf = client.Configuration()
        conf.host = url
        yield em, client.CustomObjectsApi(client.ApiClient(conf))


def create(cluster, ref: ObjectRef, manifest: dict):
    """(Re)create the object as the API server would store it; returns its emulator key."""
    em, api = cluster
    obj = copy.deepcopy(manifest)
    obj["metadata"].update(namespace=ref.namespace, name=ref.name, resourceVersion="1",
                           generation=1)
    key = next((k for k in em.objects if k[1:] == (ref.namespace, ref.name)
                and k[0].plural == ref.plural), None)
    if key is not None:
        api.delete_namespaced_custom_object(ref.group, ref.version, ref.namespace, ref.plural,
                                            ref.name)
    api.create_namespaced_custom_object(ref.group, ref.version, ref.namespace, ref.plural, obj)
    em.patches.clear()
    return next(k for k in em.objects if k[1:] == (ref.namespace, ref.name)
                and k[0].plural == ref.plural)


def get(cluster, ref: ObjectRef) -> dict:
    _, api = cluster
    return api.get_namespaced_custom_object(ref.group, ref.version, ref.namespace, ref.plural,
                                            ref.name)


def sizes(obj: dict) -> tuple[int, int]:
    """(decode replicas, prefill replicas) of an LLMInferenceService."""
    return obj["spec"]["replicas"], obj["spec"]["prefill"]["replicas"]


def test_no_code_path_patches_worker_group_replicas() -> None:
    # What patched a RayService's workerGroupSpecs is gone, and a RayService is refused.
    for name in ("rayservice_patch", "rayservice_replicas"):
        assert not hasattr(k8s_actuator, name)
    assert not hasattr(ObjectRef, "rayservice")
    with pytest.raises(ValueError, match="rayservices"):
        KubernetesPoolActuator(object(), ObjectRef("ray.io", "v1", "rayservices", NS, "x"))


def test_current(cluster, llmisvc_manifest) -> None:
    create(cluster, LLM, llmisvc_manifest)
    assert KubernetesPoolActuator(cluster[1], LLM).current() == {"prefill": 2, "decode": 3}


def test_scale_up_and_down_patch_only_replicas(cluster, llmisvc_manifest) -> None:
    em, api = cluster
    create(cluster, LLM, llmisvc_manifest)
    act = KubernetesPoolActuator(api, LLM)
    before = get(cluster, LLM)
    assert act.scale("decode", 5) and act.scale("prefill", 1)
    after = get(cluster, LLM)
    assert sizes(after) == (5, 1)
    assert [p["spec"] for p in em.patches] == [{"replicas": 5}, {"prefill": {"replicas": 1}}]
    assert em.patches[0]["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    # Nothing else in the spec moved.
    spec = copy.deepcopy(after["spec"])
    spec["replicas"], spec["prefill"]["replicas"] = 3, 2
    assert spec == before["spec"]
    assert act.scale("prefill", 1)  # already there: no write
    assert len(em.patches) == 2


def test_bad_requests_are_refused(cluster, llmisvc_manifest) -> None:
    em, api = cluster
    manifest = copy.deepcopy(llmisvc_manifest)
    del manifest["spec"]["prefill"]
    create(cluster, LLM, manifest)
    act = KubernetesPoolActuator(api, LLM)
    with pytest.raises(KeyError):
        act.scale("prefill", 1)  # a colocated service deploys no prefill workload
    with pytest.raises(ValueError):
        act.scale("decode", -1)
    assert em.patches == []


def test_kserve_autoscaled_workload_is_left_alone(cluster, llmisvc_manifest) -> None:
    em, api = cluster
    manifest = copy.deepcopy(llmisvc_manifest)
    del manifest["spec"]["replicas"]  # the CRD: `replicas` and `scaling` are mutually exclusive
    manifest["spec"]["scaling"] = {"minReplicas": 1, "maxReplicas": 4}
    create(cluster, LLM, manifest)
    act = KubernetesPoolActuator(api, LLM)
    assert not act.scale("decode", 3)
    assert em.patches == []
    assert act.scale("prefill", 4)  # the prefill workload has no `scaling`: ours to size
    assert get(cluster, LLM)["spec"]["prefill"]["replicas"] == 4


def test_conflict_is_retried(cluster, llmisvc_manifest) -> None:
    em, api = cluster
    key = create(cluster, LLM, llmisvc_manifest)
    act = KubernetesPoolActuator(api, LLM)
    # The operator updates the status between our read and our write: resourceVersion moves,
    # generation does not, so the actuator reads again and retries.
    em.before_patch.append(lambda em, _: em.write(key, {"status": {"url": "http://llama"}}))
    assert act.scale("prefill", 6)
    assert len(em.patches) == 2
    assert em.patches[0]["metadata"]["resourceVersion"] != em.patches[1]["metadata"]["resourceVersion"]
    assert act.current() == {"prefill": 6, "decode": 3}


def test_foreign_change_in_between_is_not_overwritten(cluster, llmisvc_manifest) -> None:
    em, api = cluster
    create(cluster, LLM, llmisvc_manifest)
    act = KubernetesPoolActuator(api, LLM)

    def human_edit(em, key) -> None:  # `kubectl scale` between our read and our write
        em.write(key, {"spec": {"prefill": {"replicas": 7}}})

    em.before_patch.append(human_edit)
    assert not act.scale("prefill", 5)
    assert len(em.patches) == 1  # the one refused with 409; no retry over the human's change
    assert get(cluster, LLM)["spec"]["prefill"]["replicas"] == 7


def test_foreign_change_since_last_read_is_not_overwritten(cluster, llmisvc_manifest) -> None:
    em, api = cluster
    key = create(cluster, LLM, llmisvc_manifest)
    act = KubernetesPoolActuator(api, LLM)
    assert act.current()["decode"] == 3
    em.write(key, {"spec": {"model": {"name": "llama-v2"}}})
    assert not act.scale("decode", 4)
    assert em.patches == []
    assert act.current()["decode"] == 3  # re-read: the new generation is adopted ...
    assert act.scale("decode", 4)  # ... and scaling works again
    assert act.current()["decode"] == 4


def test_conflicts_that_never_end_give_up(cluster, llmisvc_manifest) -> None:
    em, api = cluster
    key = create(cluster, LLM, llmisvc_manifest)
    act = KubernetesPoolActuator(api, LLM, max_retries=2)

    def status_update(em, _key) -> None:  # before every PATCH, forever
        em.write(key, {"status": {"tick": em.next_version()}})
        em.before_patch.append(status_update)

    em.before_patch.append(status_update)
    try:
        assert not act.scale("prefill", 3)
    finally:
        em.before_patch.clear()
    assert len(em.patches) == 3  # the first try and two retries
    assert act.current()["prefill"] == 2
