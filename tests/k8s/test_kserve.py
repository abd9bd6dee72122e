"""KServe manifests (`splitserve k8s render`): valid against the upstream CRDs, and carrying the
config's replicas and parallelism. The chart's kserve.mode renders the same objects."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from splitserve.cli import main
from splitserve.config import parse_config
from splitserve.k8s import kserve
from splitserve.k8s.chart import chart_values, effective_config, merge_values
from splitserve.k8s.render import RenderError, render
from tests.k8s.conftest import CHART

CONFIGS = {
    "disagg-tp": {"model": {"name": "llama", "path": "meta-llama/Llama-3.1-8B-Instruct"},
                  "device": "cuda",
                  "pools": {"prefill": {"replicas": 3, "tensor_parallel_size": 2},
                            "decode": {"replicas": 2, "tensor_parallel_size": 8}}},
    # PP only without disaggregation: vLLM 0.32's NIXL connector refuses it (test_preflight.py)
    "colocated": {"model": {"name": "qwen", "path": "s3://bucket/qwen2.5-7b"}, "mode": "colocated",
                  "pools": {"decode": {"replicas": 4, "tensor_parallel_size": 2,
                                       "pipeline_parallel_size": 2}}},
}


def docs(files: dict[str, str]) -> list[dict]:
    return [d for text in files.values() for d in yaml.safe_load_all(text) if d]


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("target", ["kserve", "llmisvc"])
def test_rendered_kserve_manifests_validate(validate, name: str, target: str) -> None:
    objs = docs(render(parse_config(CONFIGS[name]), target, name="svc", namespace="llm"))
    kinds = {"kserve": {"ServingRuntime", "InferenceService"},
             "llmisvc": {"LLMInferenceService"}}[target]
    assert {o["kind"] for o in objs} == kinds
    for obj in objs:
        validate(obj)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_llmisvc_replicas_and_parallelism_match_config(name: str) -> None:
    cfg = parse_config(CONFIGS[name])
    (svc,) = docs(render(cfg, "llmisvc"))
    spec = svc["spec"]
    assert svc["apiVersion"] == "serving.kserve.io/v1alpha1"
    decode = cfg.pools.decode
    assert spec["replicas"] == decode.replicas
    assert spec["parallelism"] == {"tensor": decode.tensor_parallel_size,
                                   "pipeline": decode.pipeline_parallel_size}
    gpus = spec["template"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == str(decode.ranks)
    if cfg.mode == "disaggregated":
        prefill = cfg.pools.prefill
        assert spec["prefill"]["replicas"] == prefill.replicas
        assert spec["prefill"]["parallelism"] == {"tensor": prefill.tensor_parallel_size,
                                                  "pipeline": prefill.pipeline_parallel_size}
    else:
        assert "prefill" not in spec
    assert spec["model"]["name"] == cfg.model.name
    assert spec["model"]["uri"].startswith(("hf://", "s3://"))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_inferenceservice_carries_the_config(name: str) -> None:
    cfg = parse_config(CONFIGS[name])
    objs = {o["kind"]: o for o in docs(render(cfg, "kserve", name="svc"))}
    pred = objs["InferenceService"]["spec"]["predictor"]
    assert pred["model"]["runtime"] == objs["ServingRuntime"]["metadata"]["name"] == "svc"
    env = {e["name"]: e["value"] for e in pred["model"]["env"]}
    pod_cfg = parse_config(yaml.safe_load(env["SPLITSERVE_CONFIG"]))
    assert pod_cfg.pools == cfg.pools and pod_cfg.mode == cfg.mode
    assert (pod_cfg.router.host, pod_cfg.router.port) == ("0.0.0.0", 8080)
    gpus = pred["model"]["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == str(sum(p.replicas * p.ranks for p in cfg.deployed_pools().values()))
    if cfg.model.path.startswith("s3://"):
        assert pred["model"]["storageUri"] == cfg.model.path
        assert pod_cfg.model.path == "/mnt/models"


@pytest.mark.parametrize(("values", "target"), [
    ("kserve-llmisvc-values.yaml", "llmisvc"), ("kserve-isvc-values.yaml", "kserve")])
def test_chart_kserve_mode_renders_the_same_objects(render_chart, values: str, target: str) -> None:
    path = CHART / "ci" / values
    vals = merge_values(chart_values(), yaml.safe_load(path.read_text()))
    cfg = effective_config(vals)
    image = f"{vals['image']['repository']}:{vals['image']['tag']}"
    want = docs(render(cfg, target, name="t-splitserve", image=image,
                       cpu=vals["kserve"]["cpu"], memory=vals["kserve"]["memory"],
                       pod=kserve.PodOptions.from_values(vals)))
    got = render_chart(path)
    for obj in got:
        obj["metadata"].pop("labels")
        obj["metadata"].pop("namespace", None)
    key = lambda o: o["kind"]
    got, want = sorted(got, key=key), sorted(want, key=key)
    for g, w in zip(got, want, strict=True):
        if g["kind"] == "InferenceService":  # the config travels as YAML text
            genv, wenv = (o["spec"]["predictor"]["model"]["env"][0] for o in (g, w))
            parsed = [parse_config(yaml.safe_load(e.pop("value"))) for e in (genv, wenv)]
            assert parsed[0] == parsed[1]
        assert g == w


def test_llmisvc_needs_a_model_uri() -> None:
    with pytest.raises(RenderError, match="model.path"):
        render(parse_config({"device": "cuda"}), "llmisvc")  # the built-in tiny model
    with pytest.raises(ValueError, match="model URI"):
        kserve.llm_inference_service(parse_config({"model": {"path": "/models/x"}}),
                                     name="x", image="i")


def test_cli_render_writes_files(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CONFIGS["disagg-tp"]))
    out = tmp_path / "out"
    assert main(["k8s", "render", "-c", str(cfg), "--target", "kserve", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["inferenceservice.yaml",
                                                     "servingruntime.yaml"]
    assert main(["k8s", "render", "-c", str(cfg), "--target", "llmisvc"]) == 0
    assert "kind: LLMInferenceService" in capsys.readouterr().out
    assert main(["k8s", "render", "-c", str(cfg), "--target", "helm-values", "--out",
                 str(out)]) == 0
    values = yaml.safe_load((out / "values.yaml").read_text())
    assert parse_config(values["config"]).pools == parse_config(CONFIGS["disagg-tp"]).pools
    assert values["config"]["router"]["host"] == "0.0.0.0"


def test_cli_render_refuses_a_bad_config(tmp_path: Path, capsys) -> None:
    assert main(["k8s", "render", "--target", "llmisvc"]) == 1  # default: the tiny model
    assert "model.path" in capsys.readouterr().err


def test_helm_values_target_deploys_with_the_chart(render_chart, tmp_path: Path) -> None:
    cfg = parse_config(CONFIGS["disagg-tp"])
    (tmp_path / "values.yaml").write_text(render(cfg, "helm-values")["values.yaml"])
    rs = next(d for d in render_chart(tmp_path / "values.yaml") if d["kind"] == "RayService")
    groups = {g["groupName"]: g["replicas"]
              for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert groups == {"prefill": 3, "decode": 2}
