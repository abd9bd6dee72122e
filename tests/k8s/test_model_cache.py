"""Models on Kubernetes (issue 25, point 3), with the real helm binary: the model cache
(values modelCache: claim, mounts, engine env, the download Job), a pvc:// model's claim, HF_TOKEN
in every engine container and the Job, KServe's spelling of model URIs, and the preflight's model
storage rules. Every rendered object is validated (CRDs, kubernetes-validate)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from splitserve.cli import main
from splitserve.config import parse_config
from splitserve.k8s import kserve
from splitserve.k8s.chart import chart_values, effective_config, helm_values, merge_values
from splitserve.k8s.layout import chart_model_mounts
from splitserve.k8s.preflight import errors, preflight
from splitserve.k8s.render import render
from splitserve.models.cache import cache_env
from tests.k8s.conftest import CHART

GPU = {"device": "cuda", "mode": "colocated"}
TOKEN = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "tok"}}}
CACHE = {"modelCache": {"enabled": True}, "hfTokenSecret": {"name": "hf", "key": "tok"}}


def _render(render_chart, validate, tmp_path: Path, path: str | None, **values) -> list[dict]:
    data = merge_values({"config": {**GPU, "model": {"path": path}}}, values)
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(data))
    docs = render_chart(f)
    for d in docs:
        validate(d)
    return docs


def _kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def _ray_pods(docs: list[dict]) -> list[dict]:
    """The head's and every worker group's pod spec."""
    (rs,) = _kind(docs, "RayService")
    ray = rs["spec"]["rayClusterConfig"]
    return [ray["headGroupSpec"]["template"]["spec"],
            *(g["template"]["spec"] for g in ray["workerGroupSpecs"])]


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_the_cache_is_mounted_in_every_ray_pod_with_offline_engine_env(
        render_chart, validate, tmp_path) -> None:
    docs = _render(render_chart, validate, tmp_path, "hf://org/name@v1", **CACHE,
                   config={"mode": "disaggregated"})
    pods = _ray_pods(docs)
    assert len(pods) == 3  # head, prefill, decode
    for pod in pods:
        assert {"name": "model-cache",
                "persistentVolumeClaim": {"claimName": "t-splitserve-model-cache"}} in pod["volumes"]
        (c,) = pod["containers"][:1]
        assert {"name": "model-cache", "mountPath": "/mnt/model-cache"} in c["volumeMounts"]
        env = _env(c)
        assert {k: env[k] for k in cache_env()} == cache_env()  # the Python layout's env
        assert env["HF_TOKEN"] == TOKEN["valueFrom"]
    assert chart_model_mounts(effective_config(merge_values(chart_values(), {"config": GPU})),
                              True) == {"/mnt/model-cache": "model cache"}


def test_the_chart_creates_the_claim_before_the_download(render_chart, validate, tmp_path):
    docs = _render(render_chart, validate, tmp_path, "s3://bucket/qwen", modelCache={
        "enabled": True, "storageClass": "efs-sc", "size": "50Gi",
        "accessModes": ["ReadWriteMany"]})
    (pvc,) = _kind(docs, "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == "t-splitserve-model-cache"
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "efs-sc",
                           "resources": {"requests": {"storage": "50Gi"}}}
    notes = pvc["metadata"]["annotations"]
    assert notes["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert notes["helm.sh/resource-policy"] == "keep"  # the cache outlives an uninstall
    (job,) = _kind(docs, "Job")
    assert int(notes["helm.sh/hook-weight"]) < int(job["metadata"]["annotations"]
                                                   ["helm.sh/hook-weight"])


def test_an_existing_claim_is_used_as_it_is(render_chart, validate, tmp_path) -> None:
    docs = _render(render_chart, validate, tmp_path, "hf://org/name",
                   modelCache={"enabled": True, "existingClaim": "shared-models"})
    assert _kind(docs, "PersistentVolumeClaim") == []
    for pod in [*_ray_pods(docs), _kind(docs, "Job")[0]["spec"]["template"]["spec"]]:
        assert {"name": "model-cache",
                "persistentVolumeClaim": {"claimName": "shared-models"}} in pod["volumes"]


@pytest.mark.parametrize("path", ["hf://org/name@v1", "org/name", "s3://bucket/qwen",
                                  "gs://bucket/qwen"])
def test_the_download_job_fetches_the_model_once(path, render_chart, validate, tmp_path) -> None:
    docs = _render(render_chart, validate, tmp_path, path, **CACHE,
                   serviceAccountName="model-reader", imagePullSecrets=[{"name": "regcred"}],
                   env=[{"name": "AWS_REGION", "value": "eu-west-1"}])
    (job,) = _kind(docs, "Job")
    notes = job["metadata"]["annotations"]
    assert notes["helm.sh/hook"] == "pre-install,pre-upgrade"  # before the RayService
    assert notes["helm.sh/hook-delete-policy"] == "before-hook-creation"
    spec = job["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["command"] == ["python3", "-m", "splitserve.models.download", path]
    env = _env(c)
    assert env["HF_TOKEN"] == TOKEN["valueFrom"] and env["AWS_REGION"] == "eu-west-1"
    assert env["HF_HOME"] == "/mnt/model-cache/huggingface"
    assert env["SPLITSERVE_MODEL_CACHE"] == "/mnt/model-cache"
    assert "HF_HUB_OFFLINE" not in env  # the Job is the one step that goes online
    assert c["volumeMounts"] == [{"name": "model-cache", "mountPath": "/mnt/model-cache"}]
    assert (spec["restartPolicy"], spec["serviceAccountName"]) == ("Never", "model-reader")
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert job["spec"]["backoffLimit"] == 2


@pytest.mark.parametrize("path", [None, "pvc://models/llama", "/models/llama"])
def test_no_download_for_what_is_already_on_a_volume(path, render_chart, validate, tmp_path):
    docs = _render(render_chart, validate, tmp_path, path, **CACHE)
    assert _kind(docs, "Job") == []


def test_cache_off_renders_no_cache(render_chart, validate, tmp_path) -> None:
    docs = _render(render_chart, validate, tmp_path, "hf://org/name",
                   hfTokenSecret={"name": "hf", "key": "tok"})
    assert _kind(docs, "Job") == [] and _kind(docs, "PersistentVolumeClaim") == []
    for pod in _ray_pods(docs):
        env = _env(pod["containers"][0])
        assert "HF_HUB_OFFLINE" not in env and "SPLITSERVE_MODEL_CACHE" not in env
        assert env["HF_TOKEN"] == TOKEN["valueFrom"]  # every engine container, cache or not
        assert all(v["name"] != "model-cache" for v in pod["volumes"])


def test_a_pvc_model_claim_is_mounted_where_the_engine_reads_it(render_chart, validate,
                                                                 tmp_path) -> None:
    docs = _render(render_chart, validate, tmp_path, "pvc://model-store/llama/8b")
    cfg = parse_config({**GPU, "model": {"path": "pvc://model-store/llama/8b"}})
    (mount_path,) = chart_model_mounts(cfg, False)
    assert mount_path == "/mnt/pvc/model-store"
    for pod in _ray_pods(docs):
        assert {"name": "model-pvc", "persistentVolumeClaim": {
            "claimName": "model-store", "readOnly": True}} in pod["volumes"]
        assert {"name": "model-pvc", "mountPath": mount_path,
                "readOnly": True} in pod["containers"][0]["volumeMounts"]


@pytest.mark.parametrize(("values", "message"), [
    ({"config": {"model": {"path": "s3://bucket/m"}}},
     "config.model.path s3://bucket/m is read from the model cache: set modelCache.enabled=true"),
    ({"config": {"model": {"path": "gs://bucket/m"}}}, "set modelCache.enabled=true"),
    ({"config": {"model": {"path": "hf://o/n"}}, "modelCache": {"enabled": True},
      "kserve": {"mode": "llmisvc"}}, "modelCache is for the RayService (kserve.mode none)"),
    ({"config": {"model": {"path": "oci://reg/m:1"}}},
     "config.model.path: Does not match pattern"),
])
def test_the_render_refuses_what_cannot_load(helm, tmp_path, values, message) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(merge_values({"config": GPU}, values)))
    r = helm("template", "t", str(CHART), "-f", str(f))
    assert r.returncode != 0
    assert message in r.stderr


@pytest.mark.parametrize("mode", ["inferenceservice", "llmisvc"])
def test_kserve_modes_take_the_hub_revision_in_kserves_syntax_and_the_token(
        mode, render_chart, validate, tmp_path) -> None:
    values = {"config": {**GPU, "model": {"path": "hf://org/name@v1"}}, "kserve": {"mode": mode},
              "hfTokenSecret": {"name": "hf", "key": "tok"}}
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    docs = render_chart(f)
    for d in docs:
        validate(d)
    vals = merge_values(chart_values(), values)
    target = {"inferenceservice": "kserve", "llmisvc": "llmisvc"}[mode]
    want = [d for text in render(effective_config(vals), target, name="t-splitserve",
                                 pod=kserve.PodOptions.from_values(vals)).values()
            for d in yaml.safe_load_all(text) if d]
    for objs in (docs, want):
        if mode == "llmisvc":
            (svc,) = _kind(objs, "LLMInferenceService")
            assert svc["spec"]["model"]["uri"] == "hf://org/name:v1"
            assert TOKEN in svc["spec"]["template"]["containers"][0]["env"]
        else:
            (isvc,) = _kind(objs, "InferenceService")
            model = isvc["spec"]["predictor"]["model"]
            assert model["storageUri"] == "hf://org/name:v1"
            assert TOKEN in model["env"]


# --- preflight: model storage on the helm target ---

S3 = parse_config({**GPU, "model": {"path": "s3://bucket/m"}, "router": {"host": "0.0.0.0"}})


def test_preflight_s3_without_the_cache_is_an_error_naming_the_key() -> None:
    (f,) = errors(preflight(S3, "helm", values=chart_values()))
    assert (f.key, f.level) == ("modelCache.enabled", "error")
    assert f.message.startswith("model.path s3://bucket/m is read from the chart's model cache")
    assert errors(preflight(S3, "helm", values={"modelCache": {"enabled": True}})) == []
    assert errors(preflight(S3, "kserve")) == []  # KServe's storage initializer fetches it


def test_preflight_refuses_a_mount_where_the_chart_mounts_the_model() -> None:
    pvc = parse_config({**GPU, "model": {"path": "pvc://store/m"}, "router": {"host": "0.0.0.0"}})
    taken = {"extraVolumeMounts": [{"name": "x", "mountPath": "/mnt/pvc/store"}]}
    (f,) = errors(preflight(pvc, "helm", values=taken))
    assert f.key == "extraVolumeMounts"
    assert f.message == ("/mnt/pvc/store is where the chart mounts the claim 'store' of the "
                         "pvc:// model; mount yours elsewhere")
    assert errors(preflight(pvc, "helm")) == []  # the chart mounts the claim itself


def test_cli_check_reads_the_values_files(tmp_path: Path, capsys) -> None:
    cfg, on = tmp_path / "s3.yaml", tmp_path / "cache.yaml"
    cfg.write_text(yaml.safe_dump(S3.model_dump(mode="json")))
    on.write_text("modelCache: {enabled: true}\n")
    assert main(["k8s", "check", "-c", str(cfg)]) == 1
    assert "error: modelCache.enabled: model.path s3://bucket/m" in capsys.readouterr().err
    assert main(["k8s", "check", "-c", str(cfg), "-f", str(on)]) == 0


def test_helm_values_of_an_s3_model_turn_the_cache_on() -> None:
    assert helm_values(S3)["modelCache"] == {"enabled": True}
    assert "modelCache" not in helm_values(parse_config({"model": {"path": "org/name"}}))
    assert "modelCache:\n  enabled: true" in render(S3, "helm-values")["values.yaml"]
