"""The KServe modes honour the chart's pod values (issue 25, point 4): env, imagePullSecrets,
hfTokenSecret, workers.<role> scheduling, extraVolumes/Mounts and /dev/shm for TP > 1. Each field
is checked on the chart's render of both modes, which must validate against the CRDs and equal
splitserve.k8s.kserve's render for the same values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from splitserve.config import parse_config
from splitserve.k8s import kserve
from splitserve.k8s.chart import chart_values, effective_config, merge_values
from splitserve.k8s.render import render
from tests.k8s.conftest import CHART

MODES = {"llmisvc": "kserve-llmisvc-values.yaml", "inferenceservice": "kserve-isvc-values.yaml"}
TARGET = {"llmisvc": "llmisvc", "inferenceservice": "kserve"}

ENV = [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]
PULL = [{"name": "regcred"}]
SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
VOLUMES = [{"name": "models", "persistentVolumeClaim": {"claimName": "model-cache"}}]
MOUNTS = [{"name": "models", "mountPath": "/models", "readOnly": True}]
HF_TOKEN = {"name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "hf-secret", "key": "hf_token"}}}
SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}


def _values(mode: str, extra: dict) -> dict:
    base = yaml.safe_load((CHART / "ci" / MODES[mode]).read_text())
    return merge_values(base, extra)


def _chart(render_chart, tmp_path: Path, validate, mode: str, extra: dict) -> list[dict]:
    """The chart's KServe objects for the mode's CI values plus `extra`, CRD-validated and equal
    to the Python render of the same values."""
    values = _values(mode, extra)
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    got = render_chart(path)
    for obj in got:
        validate(obj)
    vals = merge_values(chart_values(), values)
    want = yaml.safe_load_all("".join(render(
        effective_config(vals), TARGET[mode], name="t-splitserve",
        image=f"{vals['image']['repository']}:{vals['image']['tag']}",
        cpu=vals["kserve"]["cpu"], memory=vals["kserve"]["memory"],
        pod=kserve.PodOptions.from_values(vals)).values()))
    want = sorted((w for w in want if w), key=lambda o: o["kind"])
    for g, w in zip(sorted(got, key=lambda o: o["kind"]), want, strict=True):
        g = yaml.safe_load(yaml.safe_dump(g))
        g["metadata"].pop("labels")
        g["metadata"].pop("namespace", None)
        if g["kind"] == "InferenceService":  # the config travels as YAML text
            for o in (g, w):
                cfg_env = o["spec"]["predictor"]["model"]["env"][0]
                cfg_env["value"] = parse_config(yaml.safe_load(cfg_env["value"]))
        assert g == w
    return got


def pods(objs: list[dict]) -> dict[str, tuple[dict, dict]]:
    """role -> (pod spec, engine container) of the KServe objects."""
    out = {}
    for obj in objs:
        if obj["kind"] == "LLMInferenceService":
            out["decode"] = obj["spec"]["template"]
            if "prefill" in obj["spec"]:
                out["prefill"] = obj["spec"]["prefill"]["template"]
            return {r: (t, t["containers"][0]) for r, t in out.items()}
        if obj["kind"] == "InferenceService":
            pred = obj["spec"]["predictor"]
            return {"decode": (pred, pred["model"])}
    raise AssertionError("no KServe workload rendered")


@pytest.fixture
def chart(render_chart, tmp_path, validate):
    return lambda mode, extra: pods(_chart(render_chart, tmp_path, validate, mode, extra))


@pytest.mark.parametrize("mode", list(MODES))
def test_env(chart, mode: str) -> None:
    for _, container in chart(mode, {"env": ENV}).values():
        assert ENV[0] in container["env"]


@pytest.mark.parametrize("mode", list(MODES))
def test_hf_token_secret_env(chart, mode: str) -> None:
    for _, container in chart(mode, {"hfTokenSecret": {"name": "hf-secret",
                                                        "key": "hf_token"}}).values():
        assert HF_TOKEN in container["env"]
    for _, container in chart(mode, {}).values():
        assert all(e["name"] != "HF_TOKEN" for e in container.get("env", []))


@pytest.mark.parametrize("mode", list(MODES))
def test_image_pull_secrets(chart, mode: str) -> None:
    for pod, _ in chart(mode, {"imagePullSecrets": PULL}).values():
        assert pod["imagePullSecrets"] == PULL


@pytest.mark.parametrize("mode", list(MODES))
def test_node_selector(chart, mode: str) -> None:
    extra = {"workers": {r: {"nodeSelector": SELECTOR} for r in ("prefill", "decode")}}
    for pod, _ in chart(mode, extra).values():
        assert pod["nodeSelector"] == SELECTOR


@pytest.mark.parametrize("mode", list(MODES))
def test_tolerations(chart, mode: str) -> None:
    extra = {"workers": {r: {"tolerations": TOLERATIONS} for r in ("prefill", "decode")}}
    for pod, _ in chart(mode, extra).values():
        assert pod["tolerations"] == TOLERATIONS


def test_llmisvc_scheduling_is_per_pool(chart) -> None:
    got = chart("llmisvc", {"workers": {"prefill": {"nodeSelector": SELECTOR}}})
    assert got["prefill"][0]["nodeSelector"] == SELECTOR
    assert "nodeSelector" not in got["decode"][0]


@pytest.mark.parametrize("mode", list(MODES))
def test_extra_volumes_and_mounts(chart, mode: str) -> None:
    for pod, container in chart(mode, {"extraVolumes": VOLUMES,
                                       "extraVolumeMounts": MOUNTS}).values():
        assert VOLUMES[0] in pod["volumes"]
        assert MOUNTS[0] in container["volumeMounts"]


@pytest.mark.parametrize("mode", list(MODES))
def test_shm_for_tensor_parallel(chart, mode: str) -> None:
    """The CI values run TP 2 and 4: a Memory emptyDir of workers.shmSize at /dev/shm."""
    for pod, container in chart(mode, {"workers": {"shmSize": "8Gi"}}).values():
        (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
        assert SHM_MOUNT in container["volumeMounts"]


@pytest.mark.parametrize("mode", list(MODES))
def test_no_shm_for_tp1(chart, mode: str) -> None:
    tp1 = {"config": {"pools": {r: {"tensor_parallel_size": 1} for r in ("prefill", "decode")}}}
    for pod, container in chart(mode, tp1).values():
        assert "volumes" not in pod
        assert "volumeMounts" not in container


def test_llmisvc_shm_only_for_the_tp_pool(chart) -> None:
    got = chart("llmisvc", {"config": {"pools": {"prefill": {"tensor_parallel_size": 1}}}})
    assert "volumes" not in got["prefill"][0]
    assert any(v["name"] == "dshm" for v in got["decode"][0]["volumes"])


def test_rayservice_gets_hf_token(render_chart, tmp_path: Path) -> None:
    objs = render_chart(None, "--set", "hfTokenSecret.name=hf-secret",
                        "--set", "hfTokenSecret.key=hf_token")
    (ray,) = [o for o in objs if o["kind"] == "RayService"]
    spec = ray["spec"]["rayClusterConfig"]
    pods = [spec["headGroupSpec"]] + spec["workerGroupSpecs"]
    for group in pods:
        for c in group["template"]["spec"]["containers"]:
            if c["name"].startswith("ray-"):
                assert HF_TOKEN in c["env"]
