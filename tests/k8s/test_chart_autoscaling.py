"""Pods follow replicas: with `config.autoscaling` the chart's RayService turns on KubeRay's
in-tree autoscaler, and each worker group's min/max pods are the config's replica bounds times
the pods one replica needs. Rendered with the real helm binary, validated against the CRD."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from splitserve.k8s.chart import chart_values, effective_config, merge_values
from splitserve.k8s.layout import pods_per_replica, worker_group_size
from tests.k8s.conftest import CHART

EXAMPLES = {name: CHART / "ci" / f"{name}-values.yaml"
            for name in ("cpu-dev", "gpu-8-tp4", "multinode")}


def rayservice(render_chart, *files: Path) -> dict:
    args = [a for f in files[1:] for a in ("-f", str(f))]
    docs = render_chart(files[0], *args)
    (rs,) = [d for d in docs if d["kind"] == "RayService"]
    return rs


def merged(*files: Path) -> dict:
    values = chart_values()
    for f in files:
        values = merge_values(values, yaml.safe_load(f.read_text()))
    return values


def override(tmp_path: Path, autoscaling: dict) -> Path:
    path = tmp_path / "autoscaling.yaml"
    path.write_text(yaml.safe_dump({"config": {"autoscaling": autoscaling}}))
    return path


def groups(rs: dict) -> dict[str, dict]:
    return {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize(("low", "high"), [(1, 6), (0, 3), (2, 2)])
def test_autoscaler_on_and_groups_follow_the_bounds(render_chart, validate, tmp_path, example,
                                                    low, high) -> None:
    extra = override(tmp_path, {"min_replicas": low, "max_replicas": high})
    rs = rayservice(render_chart, EXAMPLES[example], extra)
    validate(rs)
    cluster = rs["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"] == {
        "upscalingMode": "Default",
        "idleTimeoutSeconds": 60,
        "resources": chart_values()["autoscaler"]["resources"],
        "securityContext": chart_values()["securityContext"],  # tests/k8s/test_exposure.py
    }
    cfg = effective_config(merged(EXAMPLES[example], extra))
    assert set(groups(rs)) == set(cfg.deployed_pools())
    for role, g in groups(rs).items():
        pool = cfg.deployed_pools()[role]
        per = pods_per_replica(pool)
        assert per == 1  # a replica's TP x PP ranks share one pod, on every example
        assert (g["minReplicas"], g["maxReplicas"]) == (low * per, high * per)
        assert g["replicas"] == min(max(pool.replicas, low), high) * per
        size = worker_group_size(cfg, role)
        assert size.autoscaled
        assert (g["replicas"], g["minReplicas"], g["maxReplicas"]) == (
            size.replicas, size.min_replicas, size.max_replicas)
    # The controller scales through Serve's external scaler, which must be on.
    serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
    assert serve["applications"][0]["external_scaler_enabled"] is True


def test_the_multinode_example_scales_its_gpu_pods(render_chart) -> None:
    rs = rayservice(render_chart, EXAMPLES["multinode"])
    assert rs["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    sizes = {r: (g["replicas"], g["minReplicas"], g["maxReplicas"]) for r, g in groups(rs).items()}
    assert sizes == {"prefill": (4, 1, 8), "decode": (2, 1, 8)}


@pytest.mark.parametrize("example", ["cpu-dev", "gpu-8-tp4"])
def test_without_autoscaling_the_groups_are_fixed(render_chart, example) -> None:
    rs = rayservice(render_chart, EXAMPLES[example])
    cluster = rs["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is False and "autoscalerOptions" not in cluster
    cfg = effective_config(merged(EXAMPLES[example]))
    for role, g in groups(rs).items():
        n = cfg.deployed_pools()[role].replicas
        assert (g["replicas"], g["minReplicas"], g["maxReplicas"]) == (n, n, n)
    serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
    assert serve["applications"][0]["external_scaler_enabled"] is False


def test_an_empty_autoscaling_section_means_splitserves_defaults(render_chart, tmp_path) -> None:
    extra = override(tmp_path, {})
    rs = rayservice(render_chart, EXAMPLES["gpu-8-tp4"], extra)
    assert rs["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    auto = effective_config(merged(EXAMPLES["gpu-8-tp4"], extra)).autoscaling
    assert auto is not None
    for g in groups(rs).values():
        assert (g["minReplicas"], g["maxReplicas"]) == (auto.min_replicas, auto.max_replicas)
    serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
    assert serve["applications"][0]["external_scaler_enabled"] is True


def test_autoscaler_options_come_from_values(render_chart, tmp_path) -> None:
    extra = tmp_path / "autoscaler.yaml"
    extra.write_text(yaml.safe_dump({
        "config": {"autoscaling": {"max_replicas": 4}},
        "autoscaler": {"upscalingMode": "Conservative", "idleTimeoutSeconds": 300,
                       "resources": {"limits": {"cpu": "2", "memory": "2Gi"}}},
    }))
    rs = rayservice(render_chart, EXAMPLES["cpu-dev"], extra)
    opts = rs["spec"]["rayClusterConfig"]["autoscalerOptions"]
    assert opts["upscalingMode"] == "Conservative" and opts["idleTimeoutSeconds"] == 300
    assert opts["resources"]["limits"] == {"cpu": "2", "memory": "2Gi"}
