"""A fast KV path between pods (issue 25, point 2): each `kv_transfer.fabric` preset renders
valid pod specs (resources, capabilities, env, host network, Multus annotation) into the
RayService's worker groups and the LLMInferenceService's workloads; the chart's render is the one
`splitserve.k8s.fabric.fabric_pod` computes, and the presets file the chart reads is generated
from the Python presets."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import yaml

from splitserve.config import FabricKind, KvTransferConfig
from splitserve.k8s import fabric
from splitserve.k8s.chart import chart_values, effective_config, merge_values
from splitserve.k8s.fabric import FabricValues, fabric_pod
from tests.k8s.conftest import CHART
from tests.k8s.test_kserve_pod import _chart, pods

GPU_VALUES = CHART / "ci" / "gpu-8-tp4-values.yaml"
UCX_TLS = {"name": "UCX_TLS", "value": "rc,sm,self,cuda_copy,cuda_ipc"}

# (fabric, kvFabric values, what the engine pods must get: env, resources, capabilities)
CASES = {
    "tcp": ("tcp", {}, [], {}, []),
    "infiniband": ("infiniband", {}, [UCX_TLS], {"rdma/ib": "1"}, ["IPC_LOCK"]),
    "infiniband-rails": (
        "infiniband", {"netDevices": "mlx5_0:1,mlx5_1:1", "resources": {"rdma/hca": 2}},
        [UCX_TLS, {"name": "UCX_NET_DEVICES", "value": "mlx5_0:1,mlx5_1:1"}],
        {"rdma/hca": "2"}, ["IPC_LOCK"]),
    "roce-multus": (
        "roce", {"gidIndex": 3, "networks": "default/roce-net"},
        [UCX_TLS, {"name": "UCX_IB_GID_INDEX", "value": "3"}],
        {"rdma/rdma_shared_device_a": "1"}, ["IPC_LOCK"]),
    "efa": (  # libfabric: UCX_NET_DEVICES does not apply
        "efa", {"resources": {"vpc.amazonaws.com/efa": 16}, "netDevices": "ignored"},
        [{"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"}, {"name": "FI_PROVIDER", "value": "efa"}],
        {"vpc.amazonaws.com/efa": "16"}, ["IPC_LOCK"]),
    "custom-hostnet": (
        "custom", {"env": [{"name": "UCX_TLS", "value": "tcp,cuda_copy"}], "ipcLock": True,
                   "hostNetwork": True, "netDevices": "eth1"},
        [{"name": "UCX_NET_DEVICES", "value": "eth1"},
         {"name": "UCX_TLS", "value": "tcp,cuda_copy"}],
        {}, ["IPC_LOCK"]),
    "infiniband-no-ipc-lock": ("infiniband", {"ipcLock": False}, [UCX_TLS], {"rdma/ib": "1"}, []),
}


def _values(kind: str, kv_fabric: dict, base: Path = GPU_VALUES, **config) -> dict:
    kv = {"fabric": kind} | ({"bandwidth_gbps": 100} if kind == "custom" else {})
    extra = {"config": {"kv_transfer": kv, **config}, "kvFabric": kv_fabric}
    return merge_values(yaml.safe_load(base.read_text()), extra)


def _render(render_chart, tmp_path: Path, validate, values: dict) -> list[dict]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    docs = render_chart(path)
    for doc in docs:
        validate(doc)  # RayService / LLMInferenceService against the upstream CRDs
    return docs


def _groups(docs: list[dict]) -> dict[str, dict]:
    (rs,) = [d for d in docs if d["kind"] == "RayService"]
    groups = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return {g["groupName"]: g["template"] for g in groups}


def _caps(container: dict) -> list[str]:
    return (container.get("securityContext") or {}).get("capabilities", {}).get("add", [])


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_worker_pods_get_the_fabric(render_chart, tmp_path, validate, case) -> None:
    kind, kv_fabric, env, resources, caps = CASES[case]
    values = _values(kind, kv_fabric)
    groups = _groups(_render(render_chart, tmp_path, validate, values))
    vals = merge_values(chart_values(), values)
    want = fabric_pod(effective_config(vals), FabricValues.from_values(vals))
    assert (want.env, want.resources, want.capabilities) == (env, resources, caps)
    assert set(groups) == {"prefill", "decode"}
    for template in groups.values():
        pod, (container,) = template["spec"], template["spec"]["containers"]
        got_env = container.get("env", [])
        assert got_env[len(got_env) - len(env):] == env  # after values.env (HF_TOKEN here)
        for amounts in (container["resources"]["requests"], container["resources"]["limits"]):
            assert {k: amounts[k] for k in resources} == resources
            assert amounts["nvidia.com/gpu"] == "4"
            assert not set(amounts) - {"cpu", "memory", "nvidia.com/gpu", *resources}
        assert [c for c in _caps(container) if c == "IPC_LOCK"] == caps
        host = kv_fabric.get("hostNetwork", False)
        assert pod.get("hostNetwork", False) is host
        assert pod.get("dnsPolicy") == ("ClusterFirstWithHostNet" if host else None)
        annotations = template["metadata"].get("annotations", {})
        assert annotations.get(fabric.MULTUS_ANNOTATION) == kv_fabric.get("networks")
        assert annotations == want.annotations


def test_head_pod_and_colocated_pools_get_no_fabric(render_chart, tmp_path, validate) -> None:
    kv_fabric = {"networks": "ib-net", "hostNetwork": True}
    docs = _render(render_chart, tmp_path, validate, _values("infiniband", kv_fabric))
    (rs,) = [d for d in docs if d["kind"] == "RayService"]
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    assert "hostNetwork" not in head["spec"] and "rdma/ib" not in str(head)
    assert "IPC_LOCK" not in str(head)
    # colocated: one pool, no KV between pods, nothing added
    docs = _render(render_chart, tmp_path, validate,
                   _values("infiniband", kv_fabric, mode="colocated"))
    (decode,) = _groups(docs).values()
    assert "rdma/ib" not in str(decode) and "UCX_TLS" not in str(decode)
    assert "hostNetwork" not in decode["spec"] and "IPC_LOCK" not in str(decode)


@pytest.mark.parametrize("one_loop", [True, False])
def test_ray_pods_get_the_one_event_loop_switches(render_chart, tmp_path, validate,
                                                  one_loop) -> None:
    """`ray.one_event_loop` reaches every Ray pod's environment (a cluster splitserve does not
    start takes it from there: splitserve/ingress.py)."""
    from splitserve import ingress

    config = {} if one_loop else {"ray": {"one_event_loop": False}}
    docs = _render(render_chart, tmp_path, validate, _values("tcp", {}, **config))
    (rs,) = [d for d in docs if d["kind"] == "RayService"]
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    pods = [head, *_groups(docs).values()]
    want = {k: v for k, v in ingress.loop_env(one_loop).items() if v is not None}
    for pod in pods:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
        assert {k: env[k] for k in ingress.LOOP_VARIABLES if k in env} == want


@pytest.mark.parametrize("niceness", [None, 7])
def test_ray_pods_get_the_workers_niceness(render_chart, tmp_path, validate, niceness) -> None:
    """`ray.worker_niceness` (0 unless set, not Ray's 15) reaches every Ray pod's environment,
    where the raylet reads it for the replicas and engines it starts."""
    from splitserve import ingress

    config = {} if niceness is None else {"ray": {"worker_niceness": niceness}}
    docs = _render(render_chart, tmp_path, validate, _values("tcp", {}, **config))
    (rs,) = [d for d in docs if d["kind"] == "RayService"]
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    for pod in [head, *_groups(docs).values()]:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
        assert env[ingress.NICENESS] == str(0 if niceness is None else niceness)


@pytest.mark.parametrize("case", ["infiniband-rails", "efa", "custom-hostnet"])
def test_llmisvc_workloads_get_the_fabric(render_chart, tmp_path, validate, case) -> None:
    # The chart's LLMInferenceService (validated against its CRD) equals the Python render for
    # the same values (test_kserve_pod._chart), and both workloads carry the fabric. The base
    # values (ci/kserve-llmisvc-values.yaml) run RoCE over Multus; the case's kvFabric keys
    # override theirs.
    kind, kv_fabric, env, resources, caps = CASES[case]
    extra = {"config": {"kv_transfer": {"fabric": kind} | (
        {"bandwidth_gbps": 100} if kind == "custom" else {})}, "kvFabric": kv_fabric}
    objs = _chart(render_chart, tmp_path, validate, "llmisvc", extra)
    (svc,) = objs
    by_role = pods(objs)
    assert set(by_role) == {"prefill", "decode"}
    for role, (template, container) in by_role.items():
        got_env = container.get("env", [])
        assert [e for e in got_env if e in env] == env
        if kind == "efa":  # libfabric: no UCX settings, whatever the values say
            assert not [e for e in got_env if e["name"].startswith("UCX_")]
        assert {k: container["resources"]["limits"][k] for k in resources} == resources
        assert {k: container["resources"]["requests"][k] for k in resources} == resources
        assert _caps(container) == caps
        assert template.get("hostNetwork", False) is kv_fabric.get("hostNetwork", False)
        workload = svc["spec"] if role == "decode" else svc["spec"]["prefill"]
        networks = kv_fabric.get("networks", "roce-sriov")
        assert workload["annotations"] == {fabric.MULTUS_ANNOTATION: networks}


def test_inference_service_pod_gets_no_fabric(render_chart, tmp_path, validate) -> None:
    # Both pools run in the one InferenceService pod: the KV never leaves it.
    objs = _chart(render_chart, tmp_path, validate, "inferenceservice",
                  {"config": {"kv_transfer": {"fabric": "infiniband"}}})
    (_, container), = pods(objs).values()
    assert "rdma/ib" not in container["resources"]["limits"] and "UCX_TLS" not in str(container)


def test_the_rdma_example_values_render_the_rdma_pods(render_chart, validate) -> None:
    # ci/multinode-values.yaml (InfiniBand), ci/gpu-efa-values.yaml (EFA) and
    # ci/kserve-llmisvc-values.yaml (RoCE over Multus), as `helm template` renders them.
    groups = _groups(render_chart(CHART / "ci" / "multinode-values.yaml"))
    for template in groups.values():
        (container,) = template["spec"]["containers"]
        assert container["resources"]["limits"]["rdma/ib"] == "1"
        assert UCX_TLS in container["env"] and "IPC_LOCK" in _caps(container)
        assert {"name": "UCX_NET_DEVICES", "value": ",".join(
            f"mlx5_{i}:1" for i in range(8))} in container["env"]
    groups = _groups(render_chart(CHART / "ci" / "gpu-efa-values.yaml"))
    for template in groups.values():
        (container,) = template["spec"]["containers"]
        assert container["resources"]["requests"]["vpc.amazonaws.com/efa"] == "16"
        assert {"name": "FI_PROVIDER", "value": "efa"} in container["env"]
    (svc,) = render_chart(CHART / "ci" / "kserve-llmisvc-values.yaml")
    validate(svc)
    for workload in (svc["spec"], svc["spec"]["prefill"]):
        (main,) = workload["template"]["containers"]
        assert main["resources"]["limits"]["nvidia.com/roce_vf"] == "1"
        assert {"name": "UCX_IB_GID_INDEX", "value": "3"} in main["env"]
        assert workload["annotations"] == {fabric.MULTUS_ANNOTATION: "roce-sriov"}


def test_presets_file_is_generated_from_the_python_presets() -> None:
    assert fabric.PRESETS_PATH.read_text() == fabric.presets_json(), (
        "helm/splitserve/files/kv-fabric-presets.json is stale: "
        "python -m splitserve.k8s.fabric --write")
    assert fabric.main([]) == 0


@pytest.mark.parametrize("kind", typing.get_args(FabricKind))
def test_presets_agree_with_the_config(kind) -> None:
    cfg = KvTransferConfig(fabric=kind, bandwidth_gbps=100 if kind == "custom" else None)
    preset = fabric.PRESETS[kind]
    assert preset.ucx == (cfg.nixl_backend == "UCX")
    assert preset.ipc_lock == cfg.rdma  # the RDMA kinds pin memory


@pytest.mark.parametrize(("override", "key"), [
    ("kvFabric:\n  gidIndex: three\n", "kvFabric.gidIndex"),
    ("kvFabric:\n  hostnetwork: true\n", "hostnetwork"),
    ("config:\n  kv_transfer:\n    fabric: nvlink\n", "config.kv_transfer.fabric"),
])
def test_schema_rejects_bad_fabric_values(helm, tmp_path: Path, override: str, key: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(override)
    r = helm("template", "t", str(CHART), "-f", str(bad))
    assert r.returncode != 0 and key in r.stderr, r.stderr


@pytest.mark.parametrize(("router", "tenancy", "mode"), [
    ({}, {}, "colocated"),
    ({"direct_ingress": True}, {}, "colocated"),
    ({"direct_ingress": True, "direct_streaming": True, "max_body_bytes": 16 << 20},
     {"queue_timeout_s": 42.5}, "colocated"),
    # disaggregated: HAProxy's call to the router also covers decode room and the prefill
    ({"direct_ingress": True, "direct_streaming": True}, {"queue_timeout_s": 12.5},
     "disaggregated"),
])
def test_ray_pods_get_direct_ingress_and_streaming(render_chart, tmp_path, validate, router,
                                                   tenancy, mode) -> None:
    """`router.direct_ingress` turns Serve's HAProxy on in every Ray pod, and
    `router.direct_streaming` adds the ingress request router's settings, the values
    `splitserve.ingress.route_env` gives a cluster splitserve starts."""
    from splitserve import ingress
    from splitserve.config import parse_config

    config = {"mode": mode, "router": {"host": "0.0.0.0", **router}}
    if tenancy:
        config["tenancy"] = tenancy
    docs = _render(render_chart, tmp_path, validate, _values("tcp", {}, **config))
    (rs,) = [d for d in docs if d["kind"] == "RayService"]
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    cfg = parse_config(config)
    want_routing = {k: v for k, v in ingress.route_env_of(cfg).items() if v is not None}
    if mode == "disaggregated":  # 12.5 (decode gate) + 2 x 12.5 + 30 (prefill), rounded up, + 5
        assert want_routing[ingress.ROUTE_TIMEOUT] == "73"
    for pod in [head, *_groups(docs).values()]:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
        assert env.get(ingress.HA_PROXY) == ("1" if cfg.router.direct_ingress else None)
        assert {k: env[k] for k in ingress.ROUTE_VARIABLES if k in env} == want_routing
