"""The controller's Kubernetes actuator against kmock's Kubernetes emulator (with the API server's
resourceVersion/generation semantics added, see emulator.py), through the real `kubernetes`
client. The RayService under test is the one the chart renders."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client
from splitserve.controller.k8s_actuator import (
    KubernetesPoolActuator,
    ObjectRef,
    rayservice_replicas,
)

from splitserve.config import parse_config
from splitserve.k8s.render import render
from tests.k8s.conftest import CHART
from tests.k8s.emulator import ConcurrentEmulator, running_emulator

NS = "llm"
RS = ObjectRef.rayservice(NS, "t-splitserve")
LLM = ObjectRef.llm_inference_service(NS, "llama")


@pytest.fixture(scope="module")
def rayservice_manifest(render_chart) -> dict:
    docs = render_chart(CHART / "ci" / "multinode-pp-values.yaml")
    return next(d for d in docs if d["kind"] == "RayService")


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


def groups(obj: dict) -> dict[str, int]:
    return {g["groupName"]: g["replicas"]
            for g in obj["spec"]["rayClusterConfig"]["workerGroupSpecs"]}


def test_current(cluster, rayservice_manifest) -> None:
    create(cluster, RS, rayservice_manifest)
    act = KubernetesPoolActuator(cluster[1], RS)
    assert act.current() == {"prefill": 4, "decode": 2}


def test_scale_up_and_down_patch_the_right_fields(cluster, rayservice_manifest) -> None:
    em, api = cluster
    create(cluster, RS, rayservice_manifest)
    act = KubernetesPoolActuator(api, RS)
    before = get(cluster, RS)
    assert act.scale("decode", 3)
    after = get(cluster, RS)
    assert rayservice_replicas(after) == {"prefill": 4, "decode": 3}
    assert groups(after) == {"prefill": 4, "decode": 3}
    # Nothing else in the Serve config or the cluster spec moved.
    sc_before, sc_after = (yaml.safe_load(o["spec"]["serveConfigV2"]) for o in (before, after))
    sc_after["applications"][0]["deployments"][1]["num_replicas"] = 2
    assert sc_after == sc_before
    rc_after = copy.deepcopy(after["spec"]["rayClusterConfig"])
    rc_after["workerGroupSpecs"][1]["replicas"] = 2
    assert rc_after == before["spec"]["rayClusterConfig"]
    (patch,) = em.patches
    assert patch["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

    assert act.scale("prefill", 1)
    assert act.current() == {"prefill": 1, "decode": 3}
    assert groups(get(cluster, RS)) == {"prefill": 1, "decode": 3}
    assert len(em.patches) == 2
    assert act.scale("prefill", 1)  # already there: no write
    assert len(em.patches) == 2


def test_out_of_bounds_is_refused(cluster, rayservice_manifest) -> None:
    em, api = cluster
    create(cluster, RS, rayservice_manifest)
    act = KubernetesPoolActuator(api, RS)
    assert not act.scale("decode", 5)  # the chart's workers.decode.maxReplicas is 4
    assert not act.scale("decode", 0)  # ... and minReplicas 1
    assert em.patches == []
    with pytest.raises(KeyError):
        act.scale("embed", 1)
    with pytest.raises(ValueError):
        act.scale("decode", -1)


def test_conflict_is_retried(cluster, rayservice_manifest) -> None:
    em, api = cluster
    key = create(cluster, RS, rayservice_manifest)
    act = KubernetesPoolActuator(api, RS)
    # The operator updates the status between our read and our write: resourceVersion moves,
    # generation does not, so the actuator reads again and retries.
    em.before_patch.append(lambda em, _: em.write(key, {"status": {"serviceStatus": "Running"}}))
    assert act.scale("prefill", 6)
    assert len(em.patches) == 2
    assert em.patches[0]["metadata"]["resourceVersion"] != em.patches[1]["metadata"]["resourceVersion"]
    assert act.current() == {"prefill": 6, "decode": 2}
    assert groups(get(cluster, RS))["prefill"] == 6


def test_foreign_change_in_between_is_not_overwritten(cluster, rayservice_manifest) -> None:
    em, api = cluster
    create(cluster, RS, rayservice_manifest)
    act = KubernetesPoolActuator(api, RS)

    def human_edit(em, key) -> None:  # `kubectl edit` between our read and our write
        spec = copy.deepcopy(em.objects[key].raw["spec"])  # (runs in the emulator's loop)
        spec["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = 7
        em.write(key, {"spec": {"rayClusterConfig": spec["rayClusterConfig"]}})

    em.before_patch.append(human_edit)
    assert not act.scale("prefill", 5)
    assert len(em.patches) == 1  # the one refused with 409; no retry over the human's change
    assert groups(get(cluster, RS))["prefill"] == 7


def test_foreign_change_since_last_read_is_not_overwritten(cluster, rayservice_manifest) -> None:
    em, api = cluster
    key = create(cluster, RS, rayservice_manifest)
    act = KubernetesPoolActuator(api, RS)
    assert act.current()["decode"] == 2
    obj = get(cluster, RS)
    em.write(key, {"spec": {"serveConfigV2": obj["spec"]["serveConfigV2"] + "\n"}})
    assert not act.scale("decode", 3)
    assert em.patches == []
    assert act.current()["decode"] == 2  # re-read: the new generation is adopted ...
    assert act.scale("decode", 3)  # ... and scaling works again
    assert act.current()["decode"] == 3


def test_conflicts_that_never_end_give_up(cluster, rayservice_manifest) -> None:
    em, api = cluster
    key = create(cluster, RS, rayservice_manifest)
    act = KubernetesPoolActuator(api, RS, max_retries=2)

    def status_update(em, _key) -> None:  # before every PATCH, forever
        em.write(key, {"status": {"tick": em.next_version()}})
        em.before_patch.append(status_update)

    em.before_patch.append(status_update)
    try:
        assert not act.scale("prefill", 2)
    finally:
        em.before_patch.clear()
    assert len(em.patches) == 3  # the first try and two retries
    assert act.current()["prefill"] == 4


def test_llminferenceservice(cluster, llmisvc_manifest) -> None:
    em, api = cluster
    create(cluster, LLM, llmisvc_manifest)
    act = KubernetesPoolActuator(api, LLM)
    assert act.current() == {"prefill": 2, "decode": 3}
    assert act.scale("decode", 5) and act.scale("prefill", 1)
    spec = get(cluster, LLM)["spec"]
    assert (spec["replicas"], spec["prefill"]["replicas"]) == (5, 1)
    assert spec["parallelism"] == llmisvc_manifest["spec"]["parallelism"]
    assert spec["prefill"]["template"] == llmisvc_manifest["spec"]["prefill"]["template"]
    assert [p["spec"] for p in em.patches] == [{"replicas": 5}, {"prefill": {"replicas": 1}}]
